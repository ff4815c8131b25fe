package testkit

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// account is the account every test client uses (no auth configured: the global account).
const account = server.DEFAULT_GLOBAL_ACCOUNT

// clusterFormTimeout bounds the wait for routes and a JetStream meta leader. It is generous:
// a meta election after a restart takes seconds, and 4 sessions may share the machine's CPUs.
const clusterFormTimeout = 30 * time.Second

// Cluster is n in-process nats-servers with JetStream, each with its own store directory,
// joined by routes on 127.0.0.1 (the nats-server test suite's createJetStreamClusterExplicit).
// Servers are addressed by index (0..n-1); a stopped server keeps its index, ports and store
// directory, so Restart brings the same node back. A Cluster is used from the test's goroutine.
type Cluster struct {
	t     testing.TB
	name  string
	nodes []*clusterNode
	// stockLimits keeps nats-server's default JetStream limits (StockLimits).
	stockLimits bool
	// syncAlways fsyncs every write (SyncAlways).
	syncAlways bool
	// syncInterval is the store's fsync interval (SyncInterval); 0 keeps nats-server's default.
	syncInterval time.Duration
	// tags are each server's placement tags (ServerTags); nil: none.
	tags func(i int) []string
}

// ClusterOption changes how RunCluster configures its servers.
type ClusterOption func(*Cluster)

// StockLimits keeps nats-server's stock JetStream limits, among them its default of 1,000
// consumers per stream, instead of lifting the consumer cap as the embedded server does: a
// cluster that behaves like an operator's stock nats-server, where a consumer leak shows as
// failed requests.
func StockLimits() ClusterOption { return func(c *Cluster) { c.stockLimits = true } }

// SyncAlways makes every server fsync each write before acknowledging it (nats-server's
// `sync: always`, the suite's production setting), instead of the default two-minute sync
// interval: for measuring what a write costs.
func SyncAlways() ClusterOption { return func(c *Cluster) { c.syncAlways = true } }

// SyncInterval makes every server fsync its stores every d (nats-server's `sync_interval`, the
// gateway's `nats.sync: 1s`) instead of the default two minutes.
func SyncInterval(d time.Duration) ClusterOption {
	return func(c *Cluster) { c.syncInterval = d }
}

// ServerTags gives server i the placement tags tags(i) (streams placed by tag go to the
// servers that have it).
func ServerTags(tags func(i int) []string) ClusterOption {
	return func(c *Cluster) { c.tags = tags }
}

type clusterNode struct {
	name       string
	storeDir   string
	clientPort int // fixed after the first start, so a restart keeps the client URL
	routePort  int
	srv        *server.Server // nil while stopped
}

// RunCluster starts n clustered JetStream servers, waits until the routes are up and a
// JetStream meta leader knows all n peers, and shuts them all down at cleanup.
func RunCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("testkit: RunCluster needs at least one server, got %d", n)
	}
	c := &Cluster{t: t, name: "oncegate-test"}
	for _, opt := range opts {
		opt(c)
	}
	// JetStream clustering sizes its meta group from the configured routes, so every server
	// must know every route port before it starts: they are picked here. The client ports are
	// the servers' own choice (port 0).
	for i := range n {
		_, port, err := net.SplitHostPort(FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		rp, _ := strconv.Atoi(port)
		c.nodes = append(c.nodes, &clusterNode{
			name:      fmt.Sprintf("S-%d", i+1),
			storeDir:  t.TempDir(),
			routePort: rp,
		})
	}
	t.Cleanup(c.shutdown)
	for i := range c.nodes {
		c.start(i)
	}
	c.WaitFormed()
	return c
}

// options builds a node's server options afresh: nats-server keeps (and edits) the Options it
// is given, so a restart must not reuse them.
func (c *Cluster) options(i int) *server.Options {
	nd := c.nodes[i]
	routes := make([]string, 0, len(c.nodes))
	for _, o := range c.nodes {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.routePort))
	}
	port := nd.clientPort
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as 4222
	}
	o := &server.Options{
		ServerName: nd.name,
		Host:       "127.0.0.1",
		Port:       port,
		NoSigs:     true,
		NoLog:      true,
		JetStream:  true,
		StoreDir:   nd.storeDir,
		// As natsrv: CHUNKS reserves 512 MiB (its MaxBytes) on every replica. A reservation,
		// not an allocation.
		JetStreamMaxMemory: 1 << 30,
		JetStreamMaxStore:  1 << 30,
		MaxPayload:         8 << 20,
		Cluster: server.ClusterOpts{
			Name: c.name,
			Host: "127.0.0.1",
			Port: nd.routePort,
		},
		Routes: server.RoutesFromStr(strings.Join(routes, ",")),
	}
	if c.tags != nil {
		o.Tags = c.tags(i)
	}
	o.SyncAlways = c.syncAlways
	o.SyncInterval = c.syncInterval
	// As natsrv does: 2.15 caps consumers per stream at 1,000 by default.
	if !c.stockLimits {
		o.JetStreamLimits.DefaultMaxConsumers = -1
	}
	return o
}

func (c *Cluster) start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	if nd.srv != nil {
		c.t.Fatalf("testkit: server %s is already running", nd.name)
	}
	s, err := server.NewServer(c.options(i))
	if err != nil {
		c.t.Fatalf("testkit: server %s: %v", nd.name, err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		c.t.Fatalf("testkit: server %s not ready for connections", nd.name)
	}
	nd.srv = s
	nd.clientPort = s.Addr().(*net.TCPAddr).Port
}

// Stop shuts server i down (its store directory stays) and waits until it is gone.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	if nd.srv == nil {
		c.t.Fatalf("testkit: server %s is already stopped", nd.name)
	}
	nd.srv.Shutdown()
	nd.srv.WaitForShutdown()
	nd.srv = nil
}

// Restart starts the stopped server i again on its client and route ports and its store
// directory, and waits until it is ready for connections. It does not wait for it to rejoin:
// use WaitFormed, or CheckFor with StreamCurrent.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.start(i)
}

func (c *Cluster) shutdown() {
	for _, nd := range c.nodes {
		if nd.srv != nil {
			nd.srv.Shutdown()
			nd.srv.WaitForShutdown()
			nd.srv = nil
		}
	}
}

// Server returns server i, or nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server { return c.nodes[i].srv }

// Size is the number of servers, running or stopped.
func (c *Cluster) Size() int { return len(c.nodes) }

// URLs are the client URLs of all servers, running or not (they do not change on restart).
func (c *Cluster) URLs() []string {
	urls := make([]string, 0, len(c.nodes))
	for _, nd := range c.nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort))
	}
	return urls
}

// Connect opens a connection to all the cluster's URLs (it reconnects to another server when
// its own stops), closed at cleanup.
func (c *Cluster) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(strings.Join(c.URLs(), ","),
		nats.Name("testkit-cluster"),
		nats.MaxReconnects(-1),
		// The default 2 s between tries to one server would dominate a failover test.
		nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("testkit: connect to cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return nc, js
}

// ConnectTo connects to server i alone (its URL only, not randomized among the others), closed
// when the test ends: a client that must not move to a server the test stops.
func (c *Cluster) ConnectTo(t testing.TB, i int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.URLs()[i], nats.Name("testkit-cluster-"+strconv.Itoa(i)), nats.DontRandomize())
	if err != nil {
		t.Fatalf("testkit: connect to server %d: %v", i, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return nc, js
}

// WaitFormed waits until every running server has a route to every other running one and a
// JetStream meta leader counts all n servers as peers (the nats-server suite's
// checkClusterFormed, waitOnLeader and waitOnPeerCount).
func (c *Cluster) WaitFormed() {
	c.t.Helper()
	CheckFor(c.t, clusterFormTimeout, 20*time.Millisecond, c.Formed)
}

// Formed says what is still missing before the cluster is formed (nil when it is), for
// CheckFor.
func (c *Cluster) Formed() error {
	running := 0
	for _, nd := range c.nodes {
		if nd.srv != nil {
			running++
		}
	}
	for _, nd := range c.nodes {
		if nd.srv == nil {
			continue
		}
		if got := nd.srv.NumRoutes(); got < running-1 {
			return fmt.Errorf("server %s has %d routes, want %d", nd.name, got, running-1)
		}
	}
	leader := c.MetaLeader()
	if leader < 0 {
		return fmt.Errorf("no JetStream meta leader")
	}
	if peers := c.nodes[leader].srv.JetStreamClusterPeers(); len(peers) != len(c.nodes) {
		return fmt.Errorf("meta leader %s knows %d peers, want %d", c.nodes[leader].name, len(peers), len(c.nodes))
	}
	return nil
}

// LoseQuorum stops the server leading stream and one more, so the stream has no leader and
// takes no writes until one of them is back (a crash's 4-9 s election, made certain). It
// returns the two stopped servers (Restart both; three candidates elect sooner than two) and
// the survivor's index.
func (c *Cluster) LoseQuorum(stream string) (leader, other, survivor int) {
	c.t.Helper()
	leader = c.StreamLeader(stream)
	if leader < 0 {
		c.t.Fatalf("testkit: %s has no leader", stream)
	}
	other, survivor = (leader+1)%len(c.nodes), (leader+2)%len(c.nodes)
	c.Stop(leader)
	c.Stop(other)
	return leader, other, survivor
}

// Watch subscribes to subject on server i with a connection of its own (see testkit.Watch).
func (c *Cluster) Watch(i int, subject string) <-chan *nats.Msg {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs()[i])
	if err != nil {
		c.t.Fatalf("testkit: watch %s: %v", subject, err)
	}
	c.t.Cleanup(nc.Close)
	return Watch(c.t, nc, subject)
}

// MetaLeader is the index of the JetStream meta leader, or -1 when there is none.
func (c *Cluster) MetaLeader() int {
	for i, nd := range c.nodes {
		if nd.srv != nil && nd.srv.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// StreamLeader is the index of the server that leads stream (a KV bucket's stream is
// "KV_<bucket>"), or -1 when none does.
func (c *Cluster) StreamLeader(stream string) int {
	for i, nd := range c.nodes {
		if nd.srv != nil && nd.srv.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// StreamCurrent says which running replica of stream is not yet current with its leader (nil
// when all are): its raft node has caught up, and it holds the leader's last sequence. For
// CheckFor after a restart.
func (c *Cluster) StreamCurrent(stream string) error {
	leader := c.StreamLeader(stream)
	if leader < 0 {
		return fmt.Errorf("stream %s has no leader", stream)
	}
	want, err := c.streamState(leader, stream)
	if err != nil {
		return err
	}
	for i, nd := range c.nodes {
		if nd.srv == nil {
			continue
		}
		if !nd.srv.JetStreamIsStreamCurrent(account, stream) {
			return fmt.Errorf("server %s: stream %s is not current", nd.name, stream)
		}
		got, err := c.streamState(i, stream)
		if err != nil {
			return err
		}
		if got.LastSeq != want.LastSeq || got.Msgs != want.Msgs {
			return fmt.Errorf("server %s: stream %s at seq %d (%d msgs), leader %s at seq %d (%d msgs)",
				nd.name, stream, got.LastSeq, got.Msgs, c.nodes[leader].name, want.LastSeq, want.Msgs)
		}
	}
	return nil
}

// streamState is stream's state in server i's own replica.
func (c *Cluster) streamState(i int, stream string) (server.StreamState, error) {
	nd := c.nodes[i]
	ad, err := nd.srv.JszAccount(&server.JSzOptions{Account: account, Streams: true})
	if err != nil {
		return server.StreamState{}, fmt.Errorf("server %s: jsz: %w", nd.name, err)
	}
	for _, sd := range ad.Streams {
		if sd.Name == stream {
			return sd.State, nil
		}
	}
	return server.StreamState{}, fmt.Errorf("server %s holds no replica of stream %s", nd.name, stream)
}
