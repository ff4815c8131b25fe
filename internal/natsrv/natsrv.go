// Package natsrv starts the embedded nats-server with JetStream that oncegate runs on by default,
// and connects to it (in-process, no network port) or to an external NATS.
//
// Durability: the embedded server runs with `sync_interval: always` semantics (every JetStream
// file-store write is fsynced before it is acknowledged) unless a sync interval is configured.
// Only the streams that hold state use file storage (the IDEM key-value bucket, later the
// ledger); JOBS and CHUNKS are memory streams that the key records can re-drive, so they pay no
// fsync. On this class of machine a synced write costs ~0.2-0.3 ms and the disk takes ~4k
// syncs/s; a request makes two synced writes on its critical path (claim and completion).
//
// Cluster: with Options.Cluster the server is one node of a JetStream cluster of embedded
// servers (routes between oncegate processes), and Start returns once the nodes have elected
// a JetStream meta leader, so the caller's first stream request has someone to answer it.
//
// One process per store: Start takes an advisory lock on the store directory (LockFile) and
// holds it until Shutdown, so a second gateway or the ledger CLI on the same data directory is
// refused with the holder's pid instead of opening the same files.
package natsrv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// ErrNotReady is returned when the embedded server does not become ready: it did not begin
// restoring its store within Options.ReadyTimeout, or its restore made no progress for
// Options.StallTimeout. The error says which, and what the server was doing.
var ErrNotReady = errors.New("natsrv: embedded server not ready")

// ErrListen is returned when the embedded server cannot listen on Options.Listen (the port is
// taken, the host is not local).
var ErrListen = errors.New("natsrv: listen")

// ErrStart is returned when the embedded server gave up starting (for example JetStream could
// not use its store); the error carries the server's own reason.
var ErrStart = errors.New("natsrv: embedded server did not start")

// Options configures the embedded server.
type Options struct {
	// StoreDir is where JetStream keeps its files.
	StoreDir string
	// Listen is an optional client listener ("127.0.0.1:4222"); empty means no network port.
	Listen string
	// SyncInterval is how often file-store writes are fsynced; 0 means every write (always).
	SyncInterval time.Duration
	// MaxPayload bounds one message (request records and stored results); default 8 MiB.
	MaxPayload int32
	// ServerName names the server; default "oncegate". In a cluster it must be unique and
	// stable: JetStream knows its peers by name.
	ServerName string
	// Cluster, when its Name is set, makes the server one node of a JetStream cluster.
	Cluster Cluster
	// ReadyTimeout bounds the wait for a server that has not begun restoring a stream of its
	// store; 0 means DefaultReadyTimeout, or the ctx's deadline when it has one.
	ReadyTimeout time.Duration
	// StallTimeout bounds the wait for a server restoring its store: Start waits as long as
	// the restore makes progress, and gives up once it has shown none for this long; 0 means
	// DefaultStallTimeout.
	StallTimeout time.Duration
	// Log receives the restore's lines: when it begins, every few seconds how far it is, each
	// stream restored. The zero Logger logs nothing.
	Log zerolog.Logger
	// OnRecovery, when set, is called from Start's goroutine about ten times a second while
	// the server restores its store, with how far it is (the gateway answers /readyz with it).
	OnRecovery func(Recovery)
}

// Cluster joins the embedded server to other nodes' servers. Every node lists the same
// Routes, its own included (a server ignores the route to itself): JetStream sizes its meta
// group from the number of routes, so a node that lists fewer expects a smaller cluster.
type Cluster struct {
	Name   string   // the cluster's name, the same on every node
	Listen string   // host:port the other nodes' routes connect to; the port must be fixed
	Routes []string // route URLs, nats://host:port
	// Tags are the server's placement tags (a stream placed by tag goes to servers that have
	// it: a partition's own servers).
	Tags []string
	// FormTimeout bounds the wait for the cluster to elect a JetStream meta leader (the other
	// nodes may start later); 0 means the ctx's deadline, or one minute without one.
	FormTimeout time.Duration
}

// ErrClusterListen is returned when the embedded server cannot listen on Cluster.Listen.
var ErrClusterListen = errors.New("natsrv: cluster listen")

// ErrNoQuorum is returned when a clustered server's JetStream found no meta leader in time:
// too few of the routed nodes are up, or the routes do not reach them.
var ErrNoQuorum = errors.New("natsrv: JetStream cluster not formed")

// Server is a running embedded nats-server.
type Server struct {
	ns   *server.Server
	lock *dirLock
	// views keeps what StreamView has seen of each stream's Raft group.
	views raftViews
}

// Start takes the store directory's lock (see [LockFile]; [*LockedError] names the process
// that holds it), starts an embedded JetStream server and waits until it accepts connections,
// which it does once JetStream has restored every stream of the store: for as long as that
// restore makes progress (see Options.StallTimeout, Options.OnRecovery). The lock is held
// until Shutdown.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	so := &server.Options{
		ServerName:         opts.ServerName,
		JetStream:          true,
		StoreDir:           opts.StoreDir,
		DontListen:         opts.Listen == "",
		NoSigs:             true,
		NoLog:              true,
		MaxPayload:         opts.MaxPayload,
		JetStreamMaxMemory: 1 << 30,
		SyncAlways:         opts.SyncInterval == 0,
		SyncInterval:       opts.SyncInterval,
		Tags:               opts.Cluster.Tags,
	}
	if so.ServerName == "" {
		so.ServerName = "oncegate"
	}
	if so.MaxPayload == 0 {
		so.MaxPayload = 8 << 20
	}
	// 2.15 caps consumers per stream at 1,000 by default; joiners create ordered consumers.
	so.JetStreamLimits.DefaultMaxConsumers = -1
	if opts.Listen != "" {
		host, port, err := net.SplitHostPort(opts.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsrv: listen %q: %w", opts.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("natsrv: listen port %q: %w", port, err)
		}
		if p == 0 {
			// nats-server reads port 0 as its default 4222; ":0" means any free port here, as
			// it does for net.Listen (ClientURL says which).
			p = server.RANDOM_PORT
		}
		so.Host, so.Port = host, p
	}
	if opts.Cluster.Name != "" {
		if opts.ServerName == "" {
			so.ServerName = clusterServerName(opts.Cluster.Listen)
		}
		if opts.Listen == "" {
			// nats-server starts routing only once its client listener is up (StartRouting
			// waits for the accept loop): a node without nats.listen gets a loopback port of
			// the system's choice, not advertised to clients of the other nodes.
			so.DontListen, so.Host, so.Port = false, "127.0.0.1", server.RANDOM_PORT
			so.Cluster.NoAdvertise = true
		}
		if err := clusterOptions(so, opts.Cluster); err != nil {
			return nil, err
		}
	}
	lock, err := lockDir(opts.StoreDir, so.ServerName)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsrv: new server: %w", err)
	}
	// The server reports why it gave up starting (port taken, JetStream store unusable) only
	// through its logger's Fatalf, and then never becomes ready: catch that reason instead of
	// waiting out the deadline and saying "not ready". The same logger follows the store's
	// restore, which a start waits for (waitReady).
	slog := newServerLog(opts.Log)
	ns.SetLoggerV2(slog, false, false, false)
	go ns.Start()
	if werr := waitReady(ctx, ns, slog, opts, filepath.Join(so.StoreDir, server.JetStreamStoreDir)); werr != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		ferr := slog.err()
		var oe *net.OpError
		switch {
		case ferr == nil:
			return nil, werr
		case opts.Cluster.Name != "" && strings.HasPrefix(ferr.Error(), routeListenFatal) && errors.As(ferr, &oe):
			return nil, fmt.Errorf("%w %s: %w", ErrClusterListen, opts.Cluster.Listen, oe.Err)
		case opts.Listen != "" && errors.As(ferr, &oe) && oe.Op == "listen":
			return nil, fmt.Errorf("%w %s: %w", ErrListen, opts.Listen, oe.Err)
		default:
			return nil, fmt.Errorf("%w: %w", ErrStart, ferr)
		}
	}
	srv := &Server{ns: ns, lock: lock}
	if opts.Cluster.Name != "" {
		if err := srv.waitMetaLeader(ctx, opts.Cluster); err != nil {
			ns.Shutdown()
			ns.WaitForShutdown()
			return nil, err
		}
	}
	return srv, nil
}

// connectedNodes is the number of other servers this one has a route to.
func (s *Server) connectedNodes() int {
	rz, err := s.ns.Routez(nil)
	if err != nil {
		return 0
	}
	names := map[string]bool{}
	for _, r := range rz.Routes {
		names[r.RemoteName] = true
	}
	return len(names)
}

// clusterServerName is a node's default name, "<hostname>-<route port>": unique for nodes on
// different machines and for nodes on one machine, and the same at every restart.
func clusterServerName(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "oncegate"
	}
	_, port, _ := net.SplitHostPort(listen)
	return host + "-" + port
}

// routeListenFatal starts the server's fatal message when the route port cannot be bound
// (route.go: "Error listening on router port: %d - %v").
const routeListenFatal = "Error listening on router port"

// clusterOptions sets so up as a cluster node. The route port must be fixed (the other nodes
// name it in their routes), and no JetStream domain is set: the nodes form one domain.
func clusterOptions(so *server.Options, c Cluster) error {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("natsrv: cluster listen %q: %w", c.Listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 {
		return fmt.Errorf("natsrv: cluster listen %q: the port must be a fixed number", c.Listen)
	}
	if len(c.Routes) == 0 {
		return fmt.Errorf("natsrv: cluster %s has no routes", c.Name)
	}
	so.Cluster.Name, so.Cluster.Host, so.Cluster.Port = c.Name, host, p
	so.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
	return nil
}

// waitMetaLeader waits until JetStream answers an account info request, which in a cluster
// needs an elected meta leader: until then stream and bucket creation would fail. It asks
// through an in-process connection, as the gateway's own calls will.
func (s *Server) waitMetaLeader(parent context.Context, c Cluster) error {
	timeout := c.FormTimeout
	if _, ok := parent.Deadline(); timeout == 0 && !ok {
		timeout = time.Minute
	}
	ctx, cancel := parent, context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(parent, timeout)
	}
	defer cancel()
	nc, err := s.Connect("oncegate-cluster-wait")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("natsrv: jetstream: %w", err)
	}
	for {
		// A short try each time: a request sent before the election is answered by no one.
		tctx, tcancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(tctx)
		tcancel()
		// This node's copy of the meta state must be current too: stream requests are
		// answered from it.
		if err == nil && s.ns.JetStreamIsCurrent() {
			return nil
		}
		select {
		case <-ctx.Done():
			if perr := parent.Err(); perr != nil {
				return fmt.Errorf("natsrv: waiting for the JetStream cluster: %w", perr)
			}
			// Routes pools open several connections per node: count the nodes.
			return fmt.Errorf("%w: no meta leader; %d of the %d other node(s) connected (%v)",
				ErrNoQuorum, s.connectedNodes(), len(c.Routes)-1, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startFailure is the server's fatal message, unwrapping to the errors it was given.
type startFailure struct {
	msg  string
	errs []error
}

func (e *startFailure) Error() string   { return e.msg }
func (e *startFailure) Unwrap() []error { return e.errs }

// noReconnectBuffer makes a publish fail at once while its connection is reconnecting
// (nats.ErrReconnectBufExceeded, which jsretry retries), instead of being kept in nats.go's
// reconnect buffer (8 MiB by default) and sent when the connection is back. A write the
// gateway has given up on must stay given up: a claim buffered while the API's NATS server
// was down, sent when it came back, was executed and billed after its request had been
// refused with 503 (issue 43).
var noReconnectBuffer = nats.ReconnectBufSize(-1)

// Connect opens an in-process client connection to the embedded server.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect("", nats.InProcessServer(s.ns), nats.Name(name), nats.MaxReconnects(-1), noReconnectBuffer)
	if err != nil {
		return nil, fmt.Errorf("natsrv: connect in-process: %w", err)
	}
	return nc, nil
}

// Name is the server's name (in a cluster, the node's name among its peers).
func (s *Server) Name() string { return s.ns.Name() }

// ClientURL is the server's network URL when it listens, or "" when it does not.
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Shutdown stops the server, waits for it to finish, then releases the store directory's lock.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.lock.release()
}

// ConnectURL connects to an external NATS server or cluster.
func ConnectURL(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), noReconnectBuffer)
	if err != nil {
		return nil, fmt.Errorf("natsrv: connect %s: %w", url, err)
	}
	return nc, nil
}

// LeadsStream reports whether this server leads stream's Raft group, from its memory (no
// request); a single server leads every stream.
func (s *Server) LeadsStream(stream string) bool {
	if !s.ns.JetStreamIsClustered() {
		return true
	}
	return s.ns.JetStreamIsStreamLeader(account, stream)
}

// RouteMsgs is the number of messages the server has sent its peers over its routes since it
// started, Raft's own included (0 on a server without a cluster).
func (s *Server) RouteMsgs() (int64, error) { return RouteMsgsOf(s.ns) }

// RouteMsgsOf is RouteMsgs of any nats-server (a test cluster's).
func RouteMsgsOf(ns *server.Server) (int64, error) {
	rz, err := ns.Routez(nil)
	if err != nil {
		return 0, fmt.Errorf("natsrv: routes: %w", err)
	}
	var sum int64
	for _, r := range rz.Routes {
		sum += r.OutMsgs
	}
	return sum, nil
}
