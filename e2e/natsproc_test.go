package e2e

// A 3-node cluster of stock nats-server processes for the fault rows that need a NATS server
// killed -9, partitioned or power-cut (rows 3a-3c): the in-process testkit.Cluster can only
// be shut down. The binary is built once per test binary from the module cache (go.mod pins
// the version), each server has its own config file, store directory and http monitoring
// port, and the limits are the stock ones (consumers per stream are not lifted).
//
// Every route between two servers runs through a routeProxy of its own, one per direction
// (server a dials b through proxy a→b), so a partition is a Cut of the proxies of one
// server's links, and the servers see real broken TCP connections.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

var builtNATS struct {
	once sync.Once
	path string
	err  error
}

// natsServerBinary builds the nats-server go.mod pins, once, next to the oncegate binary
// (whose directory TestMain removes).
func natsServerBinary(t testing.TB) string {
	t.Helper()
	dir := filepath.Dir(oncegateBinary(t))
	builtNATS.once.Do(func() {
		path := filepath.Join(dir, "nats-server")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", path, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			builtNATS.err = fmt.Errorf("go build nats-server: %w\n%s", err, out)
			return
		}
		builtNATS.path = path
	})
	if builtNATS.err != nil {
		t.Fatal(builtNATS.err)
	}
	return builtNATS.path
}

// natsProcs is three nats-server processes on 127.0.0.1. Servers are addressed by index; a
// killed server keeps its ports, config and store directory, so Start brings the same node
// back. Used from the test's goroutine.
type natsProcs struct {
	t     *testing.T
	bin   string
	nodes []*natsNode
	// links[a][b] is the proxy server a dials to reach server b's route port.
	links [][]*routeProxy
}

type natsNode struct {
	name, conf, store string
	client, http      string // host:port
	prof              string // host:port of the server's Go profiler (/debug/pprof), for a long run's diagnosis
	p                 *proc  // nil while killed
}

// runNATSProcs starts the three servers with the given JetStream sync_interval ("always",
// "1s", …) and waits until they form a cluster with a JetStream meta leader.
func runNATSProcs(t *testing.T, syncInterval string) *natsProcs {
	t.Helper()
	c := &natsProcs{t: t, bin: natsServerBinary(t)}
	dir := t.TempDir()
	const n = 3
	routePorts := make([]string, n)
	for i := range n {
		routePorts[i] = testkit.FreeAddr(t)
		c.nodes = append(c.nodes, &natsNode{name: fmt.Sprintf("P-%d", i+1),
			conf: filepath.Join(dir, fmt.Sprintf("p%d.conf", i+1)), store: filepath.Join(dir, fmt.Sprintf("p%d-store", i+1)),
			client: testkit.FreeAddr(t), http: testkit.FreeAddr(t), prof: testkit.FreeAddr(t)})
	}
	c.links = make([][]*routeProxy, n)
	for a := range n {
		c.links[a] = make([]*routeProxy, n)
		for b := range n {
			if a != b {
				c.links[a][b] = startRouteProxy(t, routePorts[b])
			}
		}
	}
	for i, nd := range c.nodes {
		var routes []string
		for b, px := range c.links[i] {
			if b != i {
				routes = append(routes, fmt.Sprintf("%q", "nats-route://"+px.addr()))
			}
		}
		// advertise names a port nobody listens on: a server connects an "implicit" route to
		// the advertised address of a peer it learns of by gossip, which would bypass the
		// proxies (an isolated server kept a route); every peer is a configured route here,
		// so an implicit one is never needed.
		conf := fmt.Sprintf(`server_name: %s
listen: %q
http: %q
prof_port: %s
jetstream { store_dir: %q, sync_interval: %s }
cluster {
  name: oncegate-procs
  listen: %q
  advertise: %q
  routes: [%s]
}
`, nd.name, nd.client, nd.http, nd.prof[strings.LastIndex(nd.prof, ":")+1:], nd.store, syncInterval, routePorts[i], testkit.FreeAddr(t), strings.Join(routes, ", "))
		if err := os.WriteFile(nd.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.Start(i)
	}
	c.WaitHealthy()
	return c
}

// Start runs server i (again) and waits until it serves its monitoring port.
func (c *natsProcs) Start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	if nd.p != nil {
		c.t.Fatalf("natsprocs: %s is already running", nd.name)
	}
	nd.p = startProc(c.t, nd.name, c.bin, "-c", nd.conf)
	testkit.CheckFor(c.t, 20*time.Second, pollEvery, func() error {
		if nd.p.exited() {
			return nil
		}
		var v struct{}
		return c.monitor(i, "/varz", &v)
	})
	if nd.p.exited() {
		c.t.Fatalf("natsprocs: %s exited: %v\n%s", nd.name, nd.p.err, nd.p.log.String())
	}
}

// Stop sends server i SIGTERM (a graceful shutdown: its leaderships handed over) and waits
// until it is gone.
func (c *natsProcs) Stop(i int) {
	c.t.Helper()
	c.nodes[i].p.sigterm(c.t, 30*time.Second)
	c.nodes[i].p = nil
}

// Kill sends server i SIGKILL and waits until it is gone.
func (c *natsProcs) Kill(i int) {
	c.t.Helper()
	c.nodes[i].p.kill(c.t)
	c.nodes[i].p = nil
}

// Signal sends server i sig (SIGSTOP/SIGCONT: a frozen server).
func (c *natsProcs) Signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := c.nodes[i].p.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("natsprocs: %v to %s: %v", sig, c.nodes[i].name, err)
	}
}

// Running says whether server i runs.
func (c *natsProcs) Running(i int) bool { return c.nodes[i].p != nil }

// Size is the number of servers, running or not.
func (c *natsProcs) Size() int { return len(c.nodes) }

// StoreDir is server i's JetStream store directory.
func (c *natsProcs) StoreDir(i int) string { return c.nodes[i].store }

// ProfAddrs are the servers' profiler addresses (http://ADDR/debug/pprof/).
func (c *natsProcs) ProfAddrs() []string {
	out := make([]string, 0, len(c.nodes))
	for _, nd := range c.nodes {
		out = append(out, nd.prof)
	}
	return out
}

// startGateway runs the oncegate binary (serve, every role) on the three servers with the
// configuration cfg (YAML), waits until it is ready and returns its base URL.
func (c *natsProcs) startGateway(cfg string) (base string, gw *proc) {
	t := c.t
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "oncegate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr := testkit.FreeAddr(t)
	gw = startProc(t, "gateway", oncegateBinary(t), "serve", "--config", cfgPath, "--nats-url", strings.Join(c.URLs(), ","),
		"--listen", httpAddr, "--data-dir", filepath.Join(dir, "data"))
	base = "http://" + httpAddr
	waitReady(t, base, gw)
	return base, gw
}

// URLs are the servers' client URLs (they do not change on restart).
func (c *natsProcs) URLs() []string {
	urls := make([]string, 0, len(c.nodes))
	for _, nd := range c.nodes {
		urls = append(urls, "nats://"+nd.client)
	}
	return urls
}

// Connect opens a connection to all the servers, closed at cleanup.
func (c *natsProcs) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(strings.Join(c.URLs(), ","), nats.Name("e2e-natsprocs"),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("natsprocs: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// monitor GETs path from server i's monitoring port and decodes its JSON into v.
func (c *natsProcs) monitor(i int, path string, v any) error {
	r := send(http.MethodGet, "http://"+c.nodes[i].http+path, "", nil)
	if r.Err != nil || r.Status != http.StatusOK {
		return fmt.Errorf("%s %s: %d %v %q", c.nodes[i].name, path, r.Status, r.Err, tail(r.Body))
	}
	return json.Unmarshal(r.Body, v)
}

// ClientConns is the number of client connections the running servers hold (/varz), for I4.
func (c *natsProcs) ClientConns() (int, error) {
	n := 0
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		var v struct {
			Connections int `json:"connections"`
		}
		if err := c.monitor(i, "/varz", &v); err != nil {
			return 0, err
		}
		n += v.Connections
	}
	return n, nil
}

// Healthy says which running server is not yet healthy (nil when all are): /healthz answers
// ok (JetStream on, its streams and consumers current) and it sees a meta leader of the
// whole cluster.
func (c *natsProcs) Healthy() error {
	for i, nd := range c.nodes {
		if !c.Running(i) {
			continue
		}
		var h struct {
			Status string `json:"status"`
		}
		if err := c.monitor(i, "/healthz", &h); err != nil {
			return err
		}
		var jsz struct {
			Meta struct {
				Leader      string `json:"leader"`
				ClusterSize int    `json:"cluster_size"`
			} `json:"meta_cluster"`
		}
		if err := c.monitor(i, "/jsz", &jsz); err != nil {
			return err
		}
		if jsz.Meta.Leader == "" || jsz.Meta.ClusterSize != len(c.nodes) {
			return fmt.Errorf("%s: meta leader %q of %d servers", nd.name, jsz.Meta.Leader, jsz.Meta.ClusterSize)
		}
	}
	return nil
}

// WaitHealthy waits until every running server is healthy.
func (c *natsProcs) WaitHealthy() {
	c.t.Helper()
	testkit.CheckFor(c.t, 60*time.Second, 100*time.Millisecond, c.Healthy)
}

// StreamLeader is the index of the running server that says it leads stream (a KV bucket's
// stream is "KV_<bucket>"), or -1.
func (c *natsProcs) StreamLeader(stream string) int {
	for i, nd := range c.nodes {
		if !c.Running(i) {
			continue
		}
		var jsz struct {
			Accounts []struct {
				Streams []struct {
					Name    string `json:"name"`
					Cluster struct {
						Leader string `json:"leader"`
					} `json:"cluster"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		if err := c.monitor(i, "/jsz?accounts=true&streams=true", &jsz); err != nil {
			continue
		}
		for _, a := range jsz.Accounts {
			for _, s := range a.Streams {
				if s.Name == stream && s.Cluster.Leader == nd.name {
					return i
				}
			}
		}
	}
	return -1
}

// Isolate cuts every route link of server i, both directions (a minority of one), and waits
// until it has no route left; Heal undoes it and waits until the routes are back.
func (c *natsProcs) Isolate(i int) {
	c.t.Helper()
	for j := range c.nodes {
		if j != i {
			c.links[i][j].Cut()
			c.links[j][i].Cut()
		}
	}
	testkit.CheckFor(c.t, 20*time.Second, pollEvery, func() error {
		if n, err := c.routes(i); err != nil || n != 0 {
			return fmt.Errorf("isolated %s still has %d routes (%v)", c.nodes[i].name, n, err)
		}
		return nil
	})
}

// Heal reopens every cut link and waits until each server routes to the two others.
func (c *natsProcs) Heal() {
	c.t.Helper()
	for a := range c.links {
		for _, px := range c.links[a] {
			if px != nil {
				px.Heal()
			}
		}
	}
	testkit.CheckFor(c.t, 30*time.Second, pollEvery, func() error {
		for i := range c.nodes {
			if n, err := c.peers(i); err != nil || n != len(c.nodes)-1 {
				return fmt.Errorf("%s routes to %d servers (%v)", c.nodes[i].name, n, err)
			}
		}
		return nil
	})
}

type routez struct {
	Routes []struct {
		RemoteName string `json:"remote_name"`
	} `json:"routes"`
}

// routes is the number of route connections of server i (a pool of several per peer).
func (c *natsProcs) routes(i int) (int, error) {
	var rz routez
	err := c.monitor(i, "/routez", &rz)
	return len(rz.Routes), err
}

// peers is the number of distinct servers server i has routes to.
func (c *natsProcs) peers(i int) (int, error) {
	var rz routez
	if err := c.monitor(i, "/routez", &rz); err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for _, r := range rz.Routes {
		seen[r.RemoteName] = true
	}
	return len(seen), nil
}

// routeProxy is one direction of one route link: a listener on 127.0.0.1 that pipes every
// connection to a server's route port, until Cut closes them all and refuses new ones.
type routeProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and the pipes

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

func startRouteProxy(t testing.TB, target string) *routeProxy {
	t.Helper()
	// A port free when drawn was bound by someone else a moment later once in CI ("bind:
	// address already in use", beside the other packages' processes): another draw then.
	var ln net.Listener
	var err error
	for range 3 {
		if ln, err = net.Listen("tcp", testkit.FreeAddr(t)); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	px := &routeProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	px.wg.Add(1)
	go px.accept()
	t.Cleanup(px.close)
	return px
}

func (px *routeProxy) addr() string { return px.ln.Addr().String() }

func (px *routeProxy) accept() {
	defer px.wg.Done()
	for {
		in, err := px.ln.Accept()
		if err != nil {
			return // closed
		}
		out, err := net.DialTimeout("tcp", px.target, 2*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		if !px.track(in, out) {
			in.Close()
			out.Close()
			continue
		}
		px.wg.Add(2)
		go px.pipe(in, out)
		go px.pipe(out, in)
	}
}

// track registers a link's two connections unless the link is cut.
func (px *routeProxy) track(cs ...net.Conn) bool {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.cut {
		return false
	}
	for _, c := range cs {
		px.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst; when either side ends, both connections close.
func (px *routeProxy) pipe(dst, src net.Conn) {
	defer px.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	px.mu.Lock()
	delete(px.conns, dst)
	delete(px.conns, src)
	px.mu.Unlock()
}

// Cut closes every connection of the link and refuses new ones until Heal.
func (px *routeProxy) Cut() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.cut = true
	for c := range px.conns {
		c.Close()
	}
}

// Heal lets the link carry connections again.
func (px *routeProxy) Heal() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.cut = false
}

func (px *routeProxy) close() {
	px.Cut()
	_ = px.ln.Close()
	px.wg.Wait()
}

// dialJetStream connects to the NATS server (or the cluster's servers, comma-separated) at
// urls; the connection is closed when the test ends.
func dialJetStream(t testing.TB, urls string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(urls, nats.Name("e2e"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
