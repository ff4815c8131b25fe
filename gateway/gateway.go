// Package gateway assembles one oncegate process from its parts: the embedded or external
// NATS connection, the JetStream resources, the workers and the HTTP API, and stops them in
// the right order. cmd/oncegate calls it with flags and signals; tests call it to run a whole
// gateway in-process.
package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/dialects"
	"github.com/oncegate/oncegate/effects"
	"github.com/oncegate/oncegate/httpapi"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/replicas"
	"github.com/oncegate/oncegate/internal/resilience"
	"github.com/oncegate/oncegate/internal/status"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/tracing"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
	"github.com/oncegate/oncegate/workers"
)

// Gateway is one running oncegate process: NATS (embedded or not), the API, the workers.
type Gateway struct {
	// id is gatewayID's, made once.
	id    string
	cfg   *config.Config
	log   zerolog.Logger
	ns    *natsrv.Server
	conns []*nats.Conn
	api   *httpapi.Server
	hubs  []*jobs.Hub // one per partition
	ln    net.Listener
	// tlsConf is the API's TLS, loaded at start, applied when the port is bound (listenAPI).
	tlsConf *tls.Config
	apiErr  chan error
	// recovery answers on the API's port while the embedded store is restored (recovering.go).
	recovery *recoveryPort

	// metrics is the process's one registry, passed down to every room; metricsSrv serves it on
	// metrics.listen when set.
	metrics    *telemetry.Metrics
	metricsLn  net.Listener
	metricsSrv *http.Server
	metricsErr chan error

	stopWorkers context.CancelFunc
	workersDone chan struct{}
	// tally runs the API's tally flusher (which flushes once more when stopped); queue samples
	// the JOBS queue's head for admission.max_queue_wait (nil without a bound).
	tally *loop
	queue []*loop // one per partition
	// refusals releases claims this API refused (503) that the store took after all
	// (intent.Core.RunRefusals).
	refusals *loop
	// cold runs this API's cold tier (cold.go; nil without one).
	cold *coldLoop
	// ready refreshes the API's /readyz verdict (httpapi.Server.WatchReadiness).
	ready *loop
	// dashHub feeds this API's dashboards, dashPub posts this process's snapshot (dashboard.go).
	dashHub, dashPub *loop
	dashTally        *dashboard.Tally
	// keys keeps this API's copy of the run-time API keys (apikeys.go).
	keys *loop
	// quorum runs each side's kv.Store.WatchQuorum (a lease is taken over only from a steady bucket).
	quorum []*loop
	// pool is partition 0's worker pool, pools every partition's (siblings sharing its slots).
	pool     *workers.Pool
	pools    []*workers.Pool
	intents  *intent.Core
	backends map[string]*backend.Client
	// tracer exports spans when tracing.otlp_endpoint is set; off, it only carries context.
	tracer *tracing.Tracer
	// spanExporter, when set (WithSpanExporter), takes the spans instead of an OTLP endpoint.
	spanExporter sdktrace.SpanExporter
	// dialects is the one table of the APIs each backend type speaks: the API admits a request
	// to the backends the workers can send it to.
	dialects *dialect.Registry

	// res is the JetStream setup; kick asks resLoop to run it again (a connection reconnected,
	// or /readyz found a stream missing).
	res *resources
	// resAt is res for the connections' reconnect handlers, which may run while Start sets it.
	resAt   atomic.Pointer[resources]
	kick    chan struct{}
	stopRes context.CancelFunc
	resDone chan struct{}
	// resyncHub is the API's hub once it runs: after a reconnect's setup, its CHUNKS tail is
	// checked against a stream a restart recreated (jobs.Hub.Resync). Written by startAPI,
	// read by the setup loop, which starts first.
	resyncHubs atomic.Pointer[[]*jobs.Hub]
}

// Option adjusts a gateway at Start beyond its configuration (tests, embedding programs).
type Option func(*Gateway)

// WithSpanExporter sends the spans to exp (e.g. the OpenTelemetry SDK's in-memory exporter),
// each as it ends, whatever tracing.otlp_endpoint says.
func WithSpanExporter(exp sdktrace.SpanExporter) Option {
	return func(g *Gateway) { g.spanExporter = exp }
}

// Addr is the HTTP address the API listens on ("" for a worker-only process).
func (g *Gateway) Addr() string {
	if g.ln == nil {
		return ""
	}
	return g.ln.Addr().String()
}

// NATSURL is the embedded server's client URL when it listens.
func (g *Gateway) NATSURL() string {
	if g.ns == nil {
		return g.cfg.NATS.URL
	}
	return g.ns.ClientURL()
}

// StartError is a start-up failure that the configuration can fix: Field is the config path
// of the setting to change ("listen", "data_dir", "nats.listen"), so the command can name its
// flag. Msg (or, when empty, Err) says what went wrong in one line.
type StartError struct {
	Field string
	Msg   string
	Err   error
}

func (e *StartError) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	return e.Err.Error()
}

func (e *StartError) Unwrap() error { return e.Err }

// Start runs a gateway for cfg (validated). getenv resolves backend API keys. On error nothing
// is left running: what was started (listener, NATS server and its data-dir lock, connections,
// workers) is stopped before Start returns.
//
// The HTTP port is bound first, so a taken port fails before the store is opened, and the
// embedded server takes the data directory's lock (natsrv.LockFile) before it reads the store.
func Start(ctx context.Context, cfg *config.Config, log zerolog.Logger, getenv func(string) string, opts ...Option) (*Gateway, error) {
	g := &Gateway{cfg: cfg, log: log, backends: map[string]*backend.Client{}, kick: make(chan struct{}, 1), metrics: newMetrics(cfg),
		dialects: dialects.Registry(), id: gatewayID()}
	for _, o := range opts {
		o(g)
	}
	if err := g.start(ctx, getenv); err != nil {
		if serr := g.Stop(context.Background()); serr != nil {
			log.Warn().Err(serr).Msg("stopping after a failed start")
		}
		return nil, err
	}
	return g, nil
}

func (g *Gateway) start(ctx context.Context, getenv func(string) string) error {
	cfg, log := g.cfg, g.log
	serveAPI := cfg.Role == "all" || cfg.Role == "api"
	tr, err := tracing.New(tracing.Options{Endpoint: cfg.Tracing.OTLPEndpoint, Service: cmp.Or(cfg.Tracing.ServiceName, "oncegate"),
		SampleRatio: cfg.Tracing.SampleRatio, Exporter: g.spanExporter})
	if err != nil {
		return &StartError{Field: "tracing.otlp_endpoint", Err: err}
	}
	g.tracer = tr
	if serveAPI {
		// The port is tried now, so that a taken one fails the start at once, and bound for
		// good only when the API serves (listenAPI). A port listening during the seconds a
		// start takes (a restarted cluster node waits for its peers) accepts a balancer's
		// connections into the kernel's backlog: their clients retry elsewhere and are
		// answered, and the node then reads the stale requests as new arrivals, past the auto
		// window, and runs them again (issue 34's deployed row: 25 of 37 duplicates). A
		// refused connect sends them to another node instead. A random port (":0") is kept
		// from now on: nobody balances onto a port before it is known. While the embedded
		// store is restored (after a crash, seconds per million keys) the port answers at
		// once instead (recovering.go): 503 to every request, so nothing waits in a backlog,
		// and /healthz 200, so a liveness probe does not kill a restore that would start over.
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return &StartError{Field: "listen", Err: fmt.Errorf("listen %s: %w", cfg.Listen, listenCause(err))}
		}
		if _, port, _ := net.SplitHostPort(cfg.Listen); port == "0" || port == "" {
			g.ln = ln
		} else {
			_ = ln.Close()
		}
		if cfg.HTTP.TLSCert != "" {
			if g.tlsConf, err = serverTLS(cfg.HTTP.TLSCert, cfg.HTTP.TLSKey); err != nil {
				return &StartError{Field: "http.tls_cert", Err: err}
			}
		}
	}
	if err := g.listenMetrics(); err != nil {
		return err
	}
	connect := func(name string) (*nats.Conn, error) {
		var nc *nats.Conn
		var err error
		if g.ns != nil {
			nc, err = g.ns.Connect(name)
		} else {
			nc, err = natsrv.ConnectURL(cfg.NATS.URL, name)
		}
		if err == nil {
			g.conns = append(g.conns, nc)
			// A reconnect may be to a server that restarted and lost the memory streams.
			nc.SetReconnectHandler(func(*nats.Conn) { g.reconnected() })
		}
		return nc, err
	}
	if cfg.NATS.URL == "" {
		storeDir := filepath.Join(cfg.DataDir, "jetstream")
		var syncEvery time.Duration
		sync := cfg.NATS.EffectiveSync()
		if sync != "always" {
			syncEvery, _ = time.ParseDuration(sync)
		}
		cl := cfg.NATS.Cluster
		opts := natsrv.Options{StoreDir: storeDir, Listen: cfg.NATS.Listen, SyncInterval: syncEvery, MaxPayload: cfg.NATS.MaxPayload,
			ServerName: cl.ServerName, Cluster: natsrv.Cluster{Name: cl.Name, Listen: cl.Listen, Routes: cl.Routes, Tags: cl.Tags},
			Log: log.With().Str("component", "nats").Logger()}
		if serveAPI {
			opts.OnRecovery = g.onRecovery
		}
		if cl.Enabled() {
			// Start returns once the nodes elected a JetStream meta leader: say what it waits for.
			log.Info().Str("nats_cluster", cl.Name).Str("nats_cluster_listen", cl.Listen).Strs("nats_routes", cl.Routes).
				Msg("joining the NATS cluster: waiting for a majority of its nodes")
		}
		ns, err := natsrv.Start(ctx, opts)
		if err != nil {
			return embeddedStartError(cfg, err)
		}
		g.ns = ns
		if g.recovery != nil {
			g.recovery.srv.Restored()
		}
		abs, _ := filepath.Abs(storeDir)
		ev := log.Info().Str("data_dir", abs).Str("sync", cfg.NATS.EffectiveSync())
		if cl.Enabled() {
			ev = ev.Str("nats_cluster", cl.Name).Str("nats_server_name", ns.Name())
		}
		if u := g.ns.ClientURL(); u != "" {
			ev = ev.Str("nats_listen", u)
		} else {
			ev = ev.Bool("nats_network_port", false)
		}
		ev.Msg("embedded NATS JetStream started")
	}
	setupNC, err := connect("oncegate-setup")
	if err != nil {
		return err
	}
	setupJS, err := g.jetStream(setupNC)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	g.res = &resources{js: setupJS, replicas: chooseReplicas(cfg.NATS.Replicas, shapeOf(cfg.NATS.Cluster, setupNC, g.ns != nil)),
		ttl: cfg.Idempotency.TTL.D(), hot: cfg.Idempotency.HotTTL.D(), lease: cfg.Idempotency.Lease.D(), maxAckPending: cfg.Workers.Concurrency * 4, kick: g.kickSetup,
		local: g.localView(), parts: max(cfg.NATS.Partitions, 1), place: cfg.NATS.PlacePartitions}
	if g.ns != nil {
		g.res.missingStreams, g.res.self = g.ns.MissingStreams, g.ns.Name()
	}
	g.resAt.Store(g.res)
	// Watched before the setup, so that a deletion during it is not missed.
	if err := g.res.watchDeletes(setupNC); err != nil {
		return err
	}
	if err := g.res.checkPartitions(ctx); err != nil {
		if errors.Is(err, ErrPartitions) {
			return &StartError{Field: "nats.partitions", Err: err, Msg: err.Error()}
		}
		return err
	}
	g.res.coldWanted, g.res.moveExisting = cfg.Idempotency.ColdTier(), cfg.Idempotency.MoveExisting
	if err := g.ensureResourcesRetried(ctx); err != nil {
		var re *replicas.Error
		if errors.As(err, &re) {
			return &StartError{Field: "nats.replicas", Err: err, Msg: re.Error()}
		}
		return err
	}
	log.Info().Int("replicas", g.res.replicas).Bool("replicas_chosen", cfg.NATS.Replicas == 0).Msg("JetStream streams and buckets ready")
	g.startResLoop(ctx)
	g.metrics.SetBacklog(jobsBacklog(setupJS, g.res.parts))
	g.metrics.SetPartitions(g.res.Partitions)
	logRouting(log, cfg)

	if cfg.Role == "all" || cfg.Role == "worker" {
		if err := g.startWorkers(ctx, connect, getenv); err != nil {
			return err
		}
	}
	if serveAPI {
		if err := g.startAPI(ctx, connect, getenv); err != nil {
			return err
		}
	}
	conns := slices.Clone(g.conns) // the scrape reads its own copy: g.conns is Stop's
	g.metrics.SetConnected(func() bool {
		for _, nc := range conns {
			if !nc.IsConnected() {
				return false
			}
		}
		return len(conns) > 0
	})
	g.startDashboardPublisher(ctx, setupJS)
	g.serveMetrics()
	return nil
}

// clusterSetupWindow bounds the retries of ensureResources on a cluster node or an external
// NATS.
const clusterSetupWindow = time.Minute

// setupJitter bounds the random wait before a timed-out setup is tried again.
const setupJitter = time.Second

// ensureResourcesRetried is the setup (resources.ensure), retried on a cluster node or an
// external NATS while a JetStream request times out: nodes (or gateways sharing an external
// NATS) create the same streams at once, and nats-server answers a stream request only from the
// stream's leader, so a request for a stream whose creation by another process is in flight
// goes unanswered. A stream or bucket another process created meanwhile with another
// configuration ("already in use") is retried: the next attempt finds it and updates it. On a
// cluster node, a refusal to place the replicas is retried too: a node starts once a majority
// has formed, and an R3 stream needs all three (CI saw "no suitable peers for placement, peer
// offline" from all three nodes at once); an external NATS that refuses them says so at once
// (nats.replicas 5 on three servers, say). Every step is idempotent; past the window, the error is the start's one
// line. On the embedded single server nothing else creates streams: its first error is the
// start's.
func (g *Gateway) ensureResourcesRetried(parent context.Context) error {
	// The requests run without parent's deadline, so jetstream bounds each by its default
	// timeout (5 s): one unanswered request must not spend a start's whole deadline (two
	// gateways started with one both waited it out). parent's end still ends them.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	defer cancel(nil)
	stop := context.AfterFunc(parent, func() { cancel(context.Cause(parent)) })
	defer stop()
	// ended is err once parent has ended: a request cut by it says "context canceled", so the
	// cause (a deadline, say) is added.
	ended := func(err error) error {
		if errors.Is(err, context.Cause(ctx)) {
			return err
		}
		return fmt.Errorf("%w: %w", err, context.Cause(ctx))
	}
	retry := g.cfg.NATS.URL != "" || g.cfg.NATS.Cluster.Enabled()
	deadline := time.Now().Add(clusterSetupWindow)
	for {
		err := g.res.setup(ctx)
		if ctx.Err() != nil && err != nil {
			return ended(err)
		}
		if err == nil || !retry || time.Now().After(deadline) {
			return err
		}
		var wait time.Duration
		switch {
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders):
			// Two processes that created a stream at once both go unanswered (nats-server
			// 2.15), time out together and would race again on the next stream: a random
			// wait puts one ahead, and the other then finds what it created.
			wait = resilience.Backoff(0, setupJitter, setupJitter)
			g.log.Info().Err(err).Msg("JetStream setup timed out while the cluster settles: retrying")
		case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse), errors.Is(err, jetstream.ErrBucketExists):
			g.log.Info().Err(err).Msg("JetStream setup raced another process creating the same stream: retrying")
		case replicas.PeersMissing(err) && g.cfg.NATS.Cluster.Enabled():
			wait = 500 * time.Millisecond
			g.log.Info().Err(err).Msg("JetStream cannot place the replicas until every node has joined: retrying")
		case jsretry.ClusterNotAvailable(err):
			// The meta group is electing (nodes restarting together: three of a six-node
			// cluster's): every stream request is refused until it has a leader.
			wait = 500 * time.Millisecond
			g.log.Info().Err(err).Msg("JetStream's meta group has no leader yet: retrying")
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return ended(err)
		case <-time.After(wait):
		}
	}
}

// listenCause is the system's reason a listen failed ("address already in use"), without the
// "listen tcp ADDR: bind:" prefixes the caller's message already says.
func listenCause(err error) error {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

// embeddedStartError names the setting behind an embedded-server failure.
func embeddedStartError(cfg *config.Config, err error) error {
	var le *natsrv.LockedError
	var pe *fs.PathError
	switch {
	case errors.As(err, &le):
		return &StartError{Field: "data_dir", Err: err, Msg: fmt.Sprintf("data dir %s is in use by %s", cfg.DataDir, le.Who())}
	case errors.Is(err, natsrv.ErrStoreDir) && errors.As(err, &pe):
		return &StartError{Field: "data_dir", Err: err, Msg: fmt.Sprintf("data dir %s is not usable: %v", cfg.DataDir, pe)}
	case errors.Is(err, natsrv.ErrStoreDir):
		return &StartError{Field: "data_dir", Err: err, Msg: fmt.Sprintf("data dir %s is not usable: %v", cfg.DataDir, err)}
	case errors.Is(err, natsrv.ErrClusterListen):
		return &StartError{Field: "nats.cluster.listen", Err: err, Msg: fmt.Sprintf("nats cluster listen %s: %v", cfg.NATS.Cluster.Listen, listenCause(err))}
	case errors.Is(err, natsrv.ErrNoQuorum):
		return &StartError{Field: "nats.cluster.routes", Err: err}
	case errors.Is(err, natsrv.ErrListen):
		return &StartError{Field: "nats.listen", Err: err, Msg: fmt.Sprintf("nats listen %s: %v", cfg.NATS.Listen, listenCause(err))}
	}
	return err
}

// leaveIsolatedServer moves nc to another of its servers: the one it uses leads the records
// but has not heard from a quorum (kv.Store.WatchQuorum), so nothing this side writes commits.
func (g *Gateway) leaveIsolatedServer(nc *nats.Conn, name string) {
	server := nc.ConnectedServerName()
	if len(nc.Servers()) < 2 {
		g.log.Warn().Str("connection", name).Str("server", server).
			Msg("the records' leader has lost its quorum; this connection knows no other server to move to")
		return
	}
	g.log.Warn().Str("connection", name).Str("server", server).
		Msg("the records' leader has lost its quorum; reconnecting to another server")
	if err := nc.ForceReconnect(); err != nil {
		g.log.Warn().Err(err).Str("connection", name).Msg("reconnect to another server")
	}
}

// localView reads a stream's Raft group from the embedded server (nil on an external NATS).
func (g *Gateway) localView() replicas.Local {
	if g.ns == nil {
		return nil
	}
	return g.ns.StreamView
}

// reconnected is a connection's reconnect: the server may have restarted and lost the memory
// streams, so they count as missing until the setup, asked for now, has run.
func (g *Gateway) reconnected() {
	if res := g.resAt.Load(); res != nil {
		res.lost("reconnected to NATS: recreating what a restarted server loses")
		return
	}
	g.kickSetup()
}

// side is one role's own connection and the JetStream handles on it: a store per partition.
type side struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stores []*kv.Store
	board  *status.Board
}

// statusTTL is how long a worker's posted status outlives its last post.
const statusTTL = 10 * time.Second

func (g *Gateway) openSide(ctx context.Context, connect func(string) (*nats.Conn, error), name string) (*side, error) {
	nc, err := connect(name)
	if err != nil {
		return nil, err
	}
	js, err := g.jetStream(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	board, err := status.Open(ctx, js, statusTTL, g.res.replicas)
	if err != nil {
		return nil, err
	}
	s := &side{nc: nc, js: js, board: board}
	for _, p := range partition.All(g.res.parts) {
		store, err := kv.Open(ctx, js, kv.BucketConfig{TTL: g.cfg.Idempotency.TTL.D(), HotTTL: g.cfg.Idempotency.HotTTL.D(), Replicas: g.res.replicas,
			Partition: p, Placement: g.res.placement(p)})
		if err != nil {
			return nil, err
		}
		if local := g.localView(); local != nil {
			store.UseLocal(local)
		}
		g.quorum = append(g.quorum, startLoop(ctx, func(ctx context.Context) {
			store.WatchQuorum(ctx, func() { g.leaveIsolatedServer(nc, name) })
		}))
		s.stores = append(s.stores, store)
	}
	return s, nil
}

func (g *Gateway) startWorkers(ctx context.Context, connect func(string) (*nats.Conn, error), getenv func(string) string) error {
	side, err := g.openSide(ctx, connect, "oncegate-workers")
	if err != nil {
		return err
	}
	own := g.ownPartitions()
	js, store, board := side.js, side.stores[own[0]], side.board
	led := g.newLedger(js) // one ledger for the charges and the reconciler: they share its state
	backends := map[string]workers.Backend{}
	for _, b := range g.cfg.Backends {
		c, err := backend.New(b, getenv)
		if err != nil {
			return err
		}
		g.backends[b.Name] = c
		backends[b.Name] = c
	}
	id := g.id
	// The pools that post to the board run: the charge sweep leaves their records to them.
	posts, err := status.WatchPosts(side.nc, statusTTL)
	if err != nil {
		return err
	}
	pool := workers.New(js, store, workers.Options{
		ID: id, Concurrency: g.cfg.Workers.Concurrency,
		Lease: g.cfg.Idempotency.Lease.D(), RenewEvery: g.cfg.Idempotency.RenewEvery.D(),
		ShutdownGrace: g.cfg.HTTP.ShutdownGrace.D(), Backends: backends, SweepEvery: g.cfg.Workers.SweepEvery.D(), ChargeGrace: g.cfg.Workers.ChargeGrace.D(), Board: board,
		DiscardChunksAfter: g.cfg.Workers.DiscardChunksAfter.D(), ChunkLinger: g.cfg.Workers.ChunkLinger.D(),
		Ledger: led, Metrics: g.metrics, Tracer: g.tracer, CaptureContent: g.cfg.Tracing.CaptureContent, Dialects: g.dialects, Running: posts.Posting,
		Partition: own[0], Log: g.log.With().Str("component", "workers").Logger(),
	})
	g.pool, g.pools = pool, make([]*workers.Pool, len(side.stores))
	g.pools[own[0]] = pool
	for _, p := range own[1:] {
		g.pools[p] = pool.Sibling(side.stores[p], p, led)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.stopWorkers, g.workersDone = cancel, make(chan struct{})
	reconciled := make(chan struct{})
	go func() {
		defer close(reconciled)
		var served sync.WaitGroup
		served.Go(func() {
			if err := led.ServeAppends(wctx); err != nil {
				g.log.Warn().Err(err).Msg("serving forwarded ledger appends")
			}
		})
		g.reconcileLoop(wctx, led)
		served.Wait()
	}()
	go func() { // #nosec G118 -- the workers' context is deliberately cut from the caller's (it outlives Start); the status removal after they stop uses Background, bounded to 2 s
		defer close(g.workersDone)
		defer func() { <-reconciled }()
		var wg sync.WaitGroup
		for p, pl := range g.pools {
			if pl == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := pl.Run(wctx); err != nil {
					g.log.Error().Err(err).Int("partition", p).Msg("workers stopped")
				}
			}()
		}
		wg.Wait()
		// Off the board now (API nodes' /readyz), not when the entry expires (statusTTL).
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := board.Remove(rctx, id); err != nil {
			g.log.Debug().Err(err).Msg("removing this worker's status")
		}
	}()
	g.log.Info().Int("concurrency", g.cfg.Workers.Concurrency).Int("partitions", len(own)).Msg("workers started")
	return nil
}

func (g *Gateway) startAPI(ctx context.Context, connect func(string) (*nats.Conn, error), getenv func(string) string) error {
	side, err := g.openSide(ctx, connect, "oncegate-api")
	if err != nil {
		return err
	}
	nc, js, board := side.nc, side.js, side.board
	apiLog := g.log.With().Str("component", "httpapi").Logger()
	// The core fast path needs the chunks published on this process's server; in a cluster a
	// worker on another node publishes them, and interest crosses the routes asynchronously.
	// A non-stream execution's outcome is a notice everywhere (jobs.HubOptions.Notices): on a
	// cluster one whose follower's interest had not crossed the routes yet is not answered,
	// and stored as a terminal chunk, which this node's tail reads.
	single := g.ns != nil && !g.cfg.NATS.Cluster.Enabled()
	parts := make([]intent.Partition, len(side.stores))
	for p, st := range side.stores {
		hub := jobs.NewHub(nc, js, apiLog, jobs.HubOptions{CoreFastPath: single, Notices: true, Partition: partition.P(p)})
		if err := hub.StartTail(ctx); err != nil { // else made by the first feed
			apiLog.Warn().Err(err).Int("partition", p).Msg("starting the CHUNKS tail")
		}
		g.hubs = append(g.hubs, hub)
		parts[p] = intent.Partition{Store: st, Hub: hub}
	}
	g.resyncHubs.Store(&g.hubs)
	if len(g.cfg.Tenants) == 0 {
		g.log.Warn().Msg("no tenants configured: every caller is the anonymous tenant and API keys are not checked")
	}
	led := g.newLedger(js)
	budgets, err := led.TenantBudgets(budgetLimits(g.cfg.Tenants))
	if err != nil {
		return err
	}
	tally := g.startTally(ctx, js)
	idem, adm := g.cfg.Idempotency, g.cfg.Admission
	if g.cold, err = g.startCold(ctx, js, apiLog); err != nil {
		return err
	}
	if g.cold != nil {
		g.res.coldBehind = g.cold.behind // read by the readiness loop, started below
	}
	for p := range parts {
		if tier := g.cold.tierOf(partition.P(p)); tier != nil { // never a typed nil
			parts[p].Cold = tier
		}
	}
	var local intent.LocalRunner   // a bypass runs on this node's workers, when it has some
	var offer intent.Offerer       // and they take the jobs admitted here from memory
	var hold intent.Holder         // and run them here while they have a free slot
	var check intent.HolderChecker // and ask at once for another node's holder a copy waits on
	if g.pool != nil {
		local, offer, hold, check = poolOf(g.pools), poolOf(g.pools), poolOf(g.pools), poolOf(g.pools)
	}
	intents := intent.New(intent.Deps{JS: js, Partitions: parts, Budgets: budgets, Prices: prices(g.cfg.Ledger), Log: apiLog, Metrics: g.metrics,
		Tally: tally, Queue: g.startQueueWatch(ctx, js, apiLog), Local: local, Offer: offer, Hold: hold, CheckHolder: check,
		Options: intent.Options{Lease: idem.Lease.D(), TTL: idem.TTL.D(), AutoWindow: idem.AutoWindow.D(),
			StoreWait: adm.StoreWait.D(), StoreWaitMax: adm.StoreWaitMax.D(),
			ReplayCacheBytes: idem.ReplayCacheBytes, DefaultMaxTokens: g.cfg.Ledger.DefaultMaxTokens,
			MaxExecutions: adm.MaxExecutions, MaxQueueWait: adm.MaxQueueWait.D(), MaxBodyBytesInFlight: adm.MaxBodyBytesInFlight,
			Limits: tenantLimits(g.cfg)}})
	g.intents = intents
	g.refusals = startLoop(ctx, intents.RunRefusals)
	keys, err := g.startKeys(ctx, js)
	if err != nil {
		return err
	}
	models, err := newModelCatalog(g.cfg, getenv, apiLog)
	if err != nil {
		return err
	}
	posts, err := status.WatchPosts(nc, statusTTL)
	if err != nil {
		return err
	}
	var effectLedger *effects.Store
	if err := openRetried(ctx, apiLog, effects.Bucket, clusterSetupWindow, func(ctx context.Context) (err error) {
		effectLedger, err = effects.Open(ctx, js, effects.Config{TTL: idem.TTL.D(), Replicas: g.res.replicas})
		return err
	}); err != nil {
		return err
	}
	g.api = httpapi.New(httpapi.Deps{Effects: effectLedger, Keys: keys, Models: catalog(models), Dashboard: g.newDashboard(ctx, js), NC: nc, JS: js, Intents: intents, Router: g.cfg, Status: board,
		Workers: posts, Tenants: g.cfg.Tenants,
		Ledger: led, AdminKeysSHA256: g.cfg.Admin.APIKeysSHA256, Idem: idem, HTTP: g.cfg.HTTP, Log: apiLog, Resources: g.res,
		Metrics: g.metrics, Tracer: g.tracer, Dialects: g.dialects})
	if err := g.listenAPI(); err != nil {
		return err
	}
	g.ready = startLoop(ctx, g.api.WatchReadiness)
	g.apiErr = make(chan error, 1)
	go func() { g.apiErr <- g.api.App().Listener(g.ln) }()
	scheme := "http://"
	if g.cfg.HTTP.TLSCert != "" {
		scheme = "https://"
	}
	g.log.Info().Str("listen", scheme+g.ln.Addr().String()).Msg("HTTP API serving (POST /v1/chat/completions)")
	return nil
}

// listenAPI binds the API's port (unless start kept it: a random port) and wraps it in TLS
// when configured, taking it over from the recovering answers if they ran.
func (g *Gateway) listenAPI() error {
	g.closeRecoveryPort()
	if g.ln == nil {
		ln, err := net.Listen("tcp", g.cfg.Listen)
		if err != nil {
			return &StartError{Field: "listen", Err: fmt.Errorf("listen %s: %w", g.cfg.Listen, listenCause(err))}
		}
		g.ln = ln
	}
	if g.tlsConf != nil {
		g.ln = tls.NewListener(g.ln, g.tlsConf)
	}
	return nil
}

// gatewayID names this gateway on the status board, in the tally and as its worker pool's id:
// the host, the process and a random suffix. The suffix tells apart gateways that share a
// process (the test kit's clusters): each pool's charge sweep leaves the records of pools that
// still post to the board to them, and with one id for all, every sweep read every record the
// others wrote (issue 44's count: two record reads per intent).
func gatewayID() string {
	host, _ := os.Hostname()
	var r [3]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(r[:]))
}

// startTally runs the API's tally of executions avoided (flushed to OG_TALLY every
// ledger.tally_every) until Stop, which ends it after the last response and before NATS.
func (g *Gateway) startTally(ctx context.Context, js jetstream.JetStream) *ledger.Tally {
	tally := ledger.NewTally(js, ledger.TallyOptions{Node: g.id, Every: g.cfg.Ledger.TallyEvery.D(), Log: g.log})
	g.tally = startLoop(ctx, func(ctx context.Context) {
		_ = tally.Run(ctx) // it logs its own failures
	})
	return tally
}

// queueSample is how often an API node reads the JOBS queue's head for max_queue_wait.
const queueSample = 250 * time.Millisecond

// startQueueWatch samples each partition's JOBS queue head wait for admission.max_queue_wait
// until Stop; nil (no watch, no bound) when the bound is off.
func (g *Gateway) startQueueWatch(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) intent.QueueWaiter {
	if g.cfg.Admission.MaxQueueWait <= 0 {
		return nil
	}
	var qs longestWait
	for _, p := range partition.All(g.res.parts) {
		q := jobs.NewQueueWatch(js, p, workers.ConsumerName, queueSample, log)
		g.queue = append(g.queue, startLoop(ctx, q.Run))
		qs = append(qs, q)
	}
	return qs
}

// longestWait is the longest head wait of the partitions' queues: a node's workers take every
// partition's jobs, so a queue that waits long anywhere says they are behind.
type longestWait []intent.QueueWaiter

func (l longestWait) Wait() time.Duration {
	var w time.Duration
	for _, q := range l {
		w = max(w, q.Wait())
	}
	return w
}

// ownPartitions are the partitions this node's workers take jobs of: with
// nats.place_partitions, those whose servers this node's server is (its og-p<k> tags), so a
// node works the jobs its own servers lead and the other partitions' jobs cross no route to it;
// else, or on a node tagged for none, every partition.
func (g *Gateway) ownPartitions() []partition.P {
	all := partition.All(g.res.parts)
	if !g.cfg.NATS.PlacePartitions {
		return all
	}
	var own []partition.P
	for _, p := range all {
		if slices.Contains(g.cfg.NATS.Cluster.Tags, p.Tag()) {
			own = append(own, p)
		}
	}
	if len(own) == 0 {
		return all
	}
	return own
}

// poolOf runs and offers each key's execution on its partition's pool; nil where this node
// runs no pool of that partition (its jobs go through JOBS to the nodes that do).
type poolOf []*workers.Pool

func (ps poolOf) pool(key string) *workers.Pool {
	if p := int(partition.OfKey(key)); p < len(ps) {
		return ps[p]
	}
	return nil
}

func (ps poolOf) RunLocal(job *jobs.Job, rec *kv.Record, out *jobs.LocalPublisher) bool {
	if p := ps.pool(job.Key); p != nil {
		return p.RunLocal(job, rec, out)
	}
	return false
}

func (ps poolOf) Hold(key string) intent.HeldSlot {
	if p := ps.pool(key); p != nil {
		if h := p.Hold(); h != nil { // never a typed nil
			return h
		}
	}
	return nil
}

func (ps poolOf) CheckHolder(key string, rec *kv.Record) {
	if p := ps.pool(key); p != nil {
		p.CheckHolder(key, rec)
	}
}

func (ps poolOf) Offer(key string, epoch int, rev uint64, rec *kv.Record) (withdraw func()) {
	if p := ps.pool(key); p != nil {
		return p.Offer(key, epoch, rev, rec)
	}
	return func() {}
}

// loop is a goroutine the gateway owns until Stop ends it.
type loop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startLoop runs run in its own goroutine until stop; ctx's values, not its end, reach it.
func startLoop(ctx context.Context, run func(context.Context)) *loop {
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &loop{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		run(lctx)
	}()
	return l
}

// stop ends the loop and waits for it (nil: nothing to stop).
func (l *loop) stop() {
	if l != nil {
		l.cancel()
		<-l.done
	}
}

// Stop shuts down in order: stop accepting and let in-flight responses finish (bounded),
// flush the tally of executions avoided, stop the workers (they feed those responses until
// then), then drain NATS and stop the server.
func (g *Gateway) Stop(ctx context.Context) error {
	g.closeRecoveryPort() // a start that failed while or after the store was restored
	var errs []error
	if g.api != nil {
		grace, cancel := context.WithTimeout(ctx, g.cfg.HTTP.ShutdownGrace.D())
		if err := g.api.Shutdown(grace); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
		}
		cancel()
		// A Shutdown that comes before the serving goroutine has handed the listener to
		// fasthttp does not reach it, and the server would then serve forever: closing the
		// listener ends it either way.
		_ = g.ln.Close()
		if err := <-g.apiErr; err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("http serve: %w", err))
		}
	} else if g.ln != nil { // bound, never served: a start that failed later
		_ = g.ln.Close()
	}
	for _, hub := range g.hubs {
		hub.Close()
	}
	g.tally.stop() // after the last response counted, before NATS closes
	g.ready.stop()
	g.keys.stop()
	g.dashPub.stop()
	g.dashHub.stop()
	for _, q := range g.queue {
		q.stop()
	}
	g.refusals.stop()
	g.cold.stop()
	if g.stopWorkers != nil {
		g.stopWorkers()
		<-g.workersDone
	}
	if g.stopRes != nil {
		g.stopRes()
		<-g.resDone
	}
	for _, l := range g.quorum {
		l.stop()
	}
	for _, nc := range g.conns {
		if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, err)
		}
	}
	for _, nc := range g.conns {
		for nc.IsDraining() {
			time.Sleep(5 * time.Millisecond)
		}
		nc.Close()
	}
	if g.ns != nil {
		g.ns.Shutdown()
	}
	if err := g.tracer.Shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := g.stopMetrics(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// logRouting says which backends serve which models, and how to add a real provider.
func logRouting(log zerolog.Logger, cfg *config.Config) {
	for _, b := range cfg.Backends {
		ev := log.Info().Str("backend", b.Name).Str("type", b.Type).Strs("models", b.Models)
		if b.BaseURL != "" {
			ev = ev.Str("base_url", b.BaseURL)
		}
		ev.Msg("backend")
	}
	only := true
	for _, b := range cfg.Backends {
		if b.Type != config.TypeMock {
			only = false
		}
	}
	if only {
		models := cfg.ModelNames()
		sort.Strings(models)
		log.Info().Str("models", strings.Join(models, ",")).
			Msg("only the built-in mock backend is configured; set OPENAI_BASE_URL and OPENAI_API_KEY (or a backends: entry in --config) to reach a real provider")
	}
}

// Backend returns the client of a configured backend of this process (workers role), e.g. to
// read the built-in mock's execution counter in tests.
func (g *Gateway) Backend(name string) (*backend.Client, bool) {
	c, ok := g.backends[name]
	return c, ok
}

// Connect opens a new connection to this gateway's NATS (embedded or external), for tools and
// tests that act beside the gateway; the caller closes it.
func (g *Gateway) Connect(name string) (*nats.Conn, error) {
	if g.ns != nil {
		return g.ns.Connect(name)
	}
	return natsrv.ConnectURL(g.cfg.NATS.URL, name)
}

// dedupHorizon is how long the ledger's in-memory id index keeps an id: at least the stream's
// Nats-Msg-Id window (see ledger.DuplicateWindow), and longer than kv.BillableWindow plus a
// minute for clocks, so that a restarted worker's charge sweep finds its charges in the index
// (TestHorizonCoversTheRestartSweep).
const dedupHorizon = 10 * time.Minute

// newLedger is the billing ledger on js, priced from the configuration: one per partition
// (a tenant's hash chain per partition), a charge written to its key's.
func (g *Gateway) newLedger(js jetstream.JetStream) *ledger.Set {
	// The id index spans minutes: a worker's charge is new by construction, and a redelivered
	// job that charges again says since when the earlier charge could exist (ChargeInput.After),
	// which is then looked up in the stream. Reconcile keeps its summary for the idempotency
	// TTL plus a day: the charges of one intent come while its record exists.
	// ledger.secret (validated: at least ledger.MinSecretLen bytes) keys the chain.
	opts := []ledger.Option{ledger.WithLogger(g.log), ledger.WithMetrics(g.metrics),
		ledger.WithDedupHorizon(dedupHorizon), ledger.WithReconcileHorizon(g.cfg.Idempotency.TTL.D() + 24*time.Hour),
		ledger.WithSecret([]byte(g.cfg.Ledger.Secret))}
	if g.ns != nil { // an embedded server knows where a stream's leader is: charges go there
		opts = append(opts, ledger.WithLeaderCheck(g.ns.LeadsStream))
	}
	return ledger.NewSet(js, prices(g.cfg.Ledger), g.cfg.Ledger.Currency, g.res.parts, opts...)
}

// reconcileLoop reverses charges that bill one intent twice, every ledger.reconcile_every.
func (g *Gateway) reconcileLoop(ctx context.Context, l *ledger.Set) {
	t := time.NewTicker(g.cfg.Ledger.ReconcileEvery.D())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep, err := l.Reconcile(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn().Err(err).Msg("reconcile")
			}
			continue
		}
		if len(rep.Appended) > 0 {
			g.log.Warn().Int("reversals", len(rep.Appended)).Int64("reversed_micros", rep.ReversedMicros).Msg("reconciler reversed duplicate charges")
		}
	}
}

// serverTLS is the HTTP API's TLS configuration: the certificate chain and key of certFile and
// keyFile, TLS 1.2 or later, HTTP/1.1 (the server speaks no HTTP/2).
func serverTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}
