package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/httpapi"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// serveMain is `oncegate serve`. ready, when set, gets the gateway once it serves (tests).
func serveMain(ctx context.Context, args []string, stderr io.Writer, getenv func(string) string, ready func(*gateway)) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML configuration file")
	listen := fs.String("listen", "", "HTTP listen address (env ONCEGATE_LISTEN; default 127.0.0.1:8080)")
	dataDir := fs.String("data-dir", "", "embedded NATS data directory (default ./data)")
	role := fs.String("role", "", "all | api | worker")
	natsURL := fs.String("nats-url", "", "external NATS URL (default: embedded server)")
	natsListen := fs.String("nats-listen", "", "let the embedded NATS server listen on ADDR (default: no port)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := config.LoadWith(*configPath, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "oncegate: %v\n", err)
		return 1
	}
	override := func(v string, dst *string) {
		if v != "" {
			*dst = v
		}
	}
	override(*listen, &cfg.Listen)
	override(*dataDir, &cfg.DataDir)
	override(*role, &cfg.Role)
	override(*natsURL, &cfg.NATS.URL)
	override(*natsListen, &cfg.NATS.Listen)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "oncegate: %v\n", err)
		return 1
	}
	log := newLogger(stderr, cfg.LogLevel)
	gw, err := startGateway(ctx, cfg, log, getenv)
	if err != nil {
		log.Error().Err(err).Msg("start failed")
		return 1
	}
	if ready != nil {
		ready(gw)
	}
	<-ctx.Done()
	log.Info().Msg("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.HTTP.ShutdownGrace.D()+5*time.Second)
	defer cancel()
	if err := gw.Stop(sctx); err != nil {
		log.Error().Err(err).Msg("shutdown")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

func newLogger(w io.Writer, level string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

// gateway is one running oncegate process: NATS (embedded or not), the API, the workers.
type gateway struct {
	cfg    *config.Config
	log    zerolog.Logger
	ns     *natsrv.Server
	conns  []*nats.Conn
	api    *httpapi.Server
	hub    *jobs.Hub
	ln     net.Listener
	apiErr chan error

	stopWorkers context.CancelFunc
	workersDone chan struct{}
	backends    map[string]*backend.Client
}

// Addr is the HTTP address the API listens on ("" for a worker-only process).
func (g *gateway) Addr() string {
	if g.ln == nil {
		return ""
	}
	return g.ln.Addr().String()
}

// NATSURL is the embedded server's client URL when it listens.
func (g *gateway) NATSURL() string {
	if g.ns == nil {
		return g.cfg.NATS.URL
	}
	return g.ns.ClientURL()
}

func startGateway(ctx context.Context, cfg *config.Config, log zerolog.Logger, getenv func(string) string) (gw *gateway, err error) {
	gw = &gateway{cfg: cfg, log: log, backends: map[string]*backend.Client{}}
	defer func() {
		if err != nil {
			_ = gw.Stop(context.Background())
		}
	}()
	connect := func(name string) (*nats.Conn, error) {
		var nc *nats.Conn
		var err error
		if gw.ns != nil {
			nc, err = gw.ns.Connect(name)
		} else {
			nc, err = natsrv.ConnectURL(cfg.NATS.URL, name)
		}
		if err == nil {
			gw.conns = append(gw.conns, nc)
		}
		return nc, err
	}
	if cfg.NATS.URL == "" {
		storeDir := filepath.Join(cfg.DataDir, "jetstream")
		var syncEvery time.Duration
		if cfg.NATS.Sync != "always" {
			syncEvery, _ = time.ParseDuration(cfg.NATS.Sync)
		}
		gw.ns, err = natsrv.Start(ctx, natsrv.Options{StoreDir: storeDir, Listen: cfg.NATS.Listen, SyncInterval: syncEvery, MaxPayload: cfg.NATS.MaxPayload})
		if err != nil {
			return nil, err
		}
		abs, _ := filepath.Abs(storeDir)
		ev := log.Info().Str("data_dir", abs).Str("sync", cfg.NATS.Sync)
		if u := gw.ns.ClientURL(); u != "" {
			ev = ev.Str("nats_listen", u)
		} else {
			ev = ev.Bool("nats_network_port", false)
		}
		ev.Msg("embedded NATS JetStream started")
	}
	setupNC, err := connect("oncegate-setup")
	if err != nil {
		return nil, err
	}
	setupJS, err := jetstream.New(setupNC)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := jobs.EnsureStreams(ctx, setupJS, jobs.StreamConfig{}); err != nil {
		return nil, err
	}
	if _, err := kv.Open(ctx, setupJS, kv.BucketConfig{TTL: cfg.Idempotency.TTL.D()}); err != nil {
		return nil, err
	}
	if _, err := workers.EnsureConsumer(ctx, setupJS, cfg.Idempotency.Lease.D(), cfg.Workers.Concurrency*4); err != nil {
		return nil, err
	}
	logRouting(log, cfg)

	if cfg.Role == "all" || cfg.Role == "worker" {
		if err := gw.startWorkers(ctx, connect, getenv); err != nil {
			return nil, err
		}
	}
	if cfg.Role == "all" || cfg.Role == "api" {
		if err := gw.startAPI(ctx, connect); err != nil {
			return nil, err
		}
	}
	return gw, nil
}

func (g *gateway) startWorkers(ctx context.Context, connect func(string) (*nats.Conn, error), getenv func(string) string) error {
	nc, err := connect("oncegate-workers")
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	store, err := kv.Open(ctx, js, kv.BucketConfig{TTL: g.cfg.Idempotency.TTL.D()})
	if err != nil {
		return err
	}
	backends := map[string]workers.Backend{}
	for _, b := range g.cfg.Backends {
		c, err := backend.New(b, getenv)
		if err != nil {
			return err
		}
		g.backends[b.Name] = c
		backends[b.Name] = c
	}
	host, _ := os.Hostname()
	pool := workers.New(js, store, workers.Options{
		ID: fmt.Sprintf("%s-%d", host, os.Getpid()), Concurrency: g.cfg.Workers.Concurrency,
		Lease: g.cfg.Idempotency.Lease.D(), RenewEvery: g.cfg.Idempotency.RenewEvery.D(),
		ShutdownGrace: g.cfg.HTTP.ShutdownGrace.D(), Backends: backends,
		Log: g.log.With().Str("component", "workers").Logger(),
	})
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.stopWorkers, g.workersDone = cancel, make(chan struct{})
	go func() {
		defer close(g.workersDone)
		if err := pool.Run(wctx); err != nil {
			g.log.Error().Err(err).Msg("workers stopped")
		}
	}()
	g.log.Info().Int("concurrency", g.cfg.Workers.Concurrency).Msg("workers started")
	return nil
}

func (g *gateway) startAPI(ctx context.Context, connect func(string) (*nats.Conn, error)) error {
	nc, err := connect("oncegate-api")
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	store, err := kv.Open(ctx, js, kv.BucketConfig{TTL: g.cfg.Idempotency.TTL.D()})
	if err != nil {
		return err
	}
	apiLog := g.log.With().Str("component", "httpapi").Logger()
	g.hub = jobs.NewHub(nc, js, apiLog, jobs.HubOptions{CoreFastPath: g.ns != nil})
	if len(g.cfg.Tenants) == 0 {
		g.log.Warn().Msg("no tenants configured: every caller is the anonymous tenant and API keys are not checked")
	}
	g.api = httpapi.New(httpapi.Deps{NC: nc, JS: js, Store: store, Hub: g.hub, Router: g.cfg, Tenants: g.cfg.Tenants,
		Idem: g.cfg.Idempotency, HTTP: g.cfg.HTTP, Log: apiLog})
	g.ln, err = net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", g.cfg.Listen, err)
	}
	g.apiErr = make(chan error, 1)
	go func() { g.apiErr <- g.api.App().Listener(g.ln) }()
	g.log.Info().Str("listen", "http://"+g.ln.Addr().String()).Msg("HTTP API serving (POST /v1/chat/completions)")
	return nil
}

// Stop shuts down in order: stop accepting and let in-flight responses finish (bounded), stop
// the workers (they feed those responses until then), then drain NATS and stop the server.
func (g *gateway) Stop(ctx context.Context) error {
	var errs []error
	if g.api != nil {
		grace, cancel := context.WithTimeout(ctx, g.cfg.HTTP.ShutdownGrace.D())
		if err := g.api.Shutdown(grace); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
		}
		cancel()
		if err := <-g.apiErr; err != nil {
			errs = append(errs, fmt.Errorf("http serve: %w", err))
		}
	}
	if g.hub != nil {
		g.hub.Close()
	}
	if g.stopWorkers != nil {
		g.stopWorkers()
		<-g.workersDone
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
