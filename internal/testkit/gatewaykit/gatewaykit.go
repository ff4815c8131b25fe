// Package gatewaykit is the part of the test kit that starts a whole oncegate gateway
// in-process: a real embedded nats-server with JetStream in a temporary directory, the
// workers, the built-in mock backend and the HTTP API on a 127.0.0.1 port. Nothing is mocked.
//
// It is a package of its own because it imports the composition root (gateway), which imports
// kv, jobs, httpapi and workers: their own in-package tests could not import a kit that does
// (an import cycle), so they use internal/testkit, which imports no project room.
package gatewaykit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
)

// Gateway is a running test gateway.
type Gateway struct {
	*gateway.Gateway
	// URL is the API base, e.g. "http://127.0.0.1:41234".
	URL string
	Cfg *config.Config
}

// Config returns the default configuration adjusted for tests: a temp data dir, a free
// loopback port, a second slow mock model ("oncegate-mock-slow": 20 ms per token), and
// idempotency timings short enough for lease tests.
func Config(t testing.TB) *config.Config {
	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.LogLevel = "warn"
	// Closing a thousand keep-alive connections under -race on a loaded CI machine outlasted
	// 3 s once (TestDuplicateStorm's stop); a test waits for its stop, it does not time it.
	cfg.HTTP.ShutdownGrace = config.Duration(10 * time.Second)
	cfg.Workers.Concurrency = 64
	cfg.Backends = append(cfg.Backends, config.Backend{
		Name: "slowmock", Type: config.TypeMock, Models: []string{"oncegate-mock-slow"},
		Timeout: config.Duration(time.Minute),
		Mock:    config.MockKnobs{InterToken: config.Duration(20 * time.Millisecond), Tokens: 16},
	})
	return cfg
}

// StartGateway runs a gateway with cfg (Config(t) when nil) and stops it when the test ends.
// No backend API key resolves (see StartGatewayEnv).
func StartGateway(t testing.TB, cfg *config.Config) *Gateway {
	t.Helper()
	return StartGatewayEnv(t, cfg, func(string) string { return "" })
}

// StartGatewayEnv is StartGateway with getenv resolving the backends' api_key_env, and opts
// (gateway.WithSpanExporter…).
func StartGatewayEnv(t testing.TB, cfg *config.Config, getenv func(string) string, opts ...gateway.Option) *Gateway {
	t.Helper()
	if cfg == nil {
		cfg = Config(t)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("gatewaykit: config: %v", err)
	}
	log := zerolog.New(io.Discard)
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := gateway.Start(ctx, cfg, log, getenv, opts...)
	if err != nil {
		t.Fatalf("gatewaykit: start: %v", err)
	}
	g := &Gateway{Gateway: gw, Cfg: cfg}
	if gw.Addr() != "" {
		g.URL = "http://" + gw.Addr()
		if cfg.HTTP.TLSCert != "" {
			g.URL = "https://" + gw.Addr()
		}
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := gw.Stop(sctx)
		if err == nil {
			return
		}
		// What still runs is what the stop waited for: the goroutines say which.
		var stacks bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		if errors.Is(err, context.DeadlineExceeded) && strings.Contains(err.Error(), "http shutdown") {
			// Seen only in loaded CI runs of TestDuplicateStorm, after every one of its 1,000
			// answers had arrived: the HTTP server waited out its grace for connections that
			// never carried a request (a client dials spares under a burst), it is thought;
			// not yet confirmed. Logged with the goroutines, not failed.
			t.Logf("gatewaykit: stop: %v (HTTP connections still open at the end of the grace)\ngoroutines:\n%s", err, stacks.String())
			return
		}
		t.Errorf("gatewaykit: stop: %v\ngoroutines:\n%s", err, stacks.String())
	})
	return g
}

// Mock returns the in-process mock server behind backend name (its execution counter).
func (g *Gateway) Mock(t testing.TB, name string) *mockllm.Server {
	t.Helper()
	c, ok := g.Backend(name)
	if !ok || c.Mock() == nil {
		t.Fatalf("gatewaykit: no mock backend %q in this process", name)
	}
	return c.Mock()
}

// JetStream opens a connection named name to the gateway's NATS, for a test that acts beside
// the gateway; it is closed when the test ends, before the gateway stops.
func (g *Gateway) JetStream(t testing.TB, name string) jetstream.JetStream {
	t.Helper()
	nc, err := g.Connect(name)
	if err != nil {
		t.Fatalf("gatewaykit: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("gatewaykit: jetstream: %v", err)
	}
	return js
}

// Client is an HTTP client for tests: loopback only, bounded.
func Client() *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
}
