package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/workers"
)

// newMetrics is the process's metrics, their labels bounded by the configured tenants, models
// and backends.
func newMetrics(cfg *config.Config) *telemetry.Metrics {
	l := telemetry.Labels{Models: cfg.ModelNames()}
	for _, t := range cfg.Tenants {
		l.Tenants = append(l.Tenants, t.ID)
	}
	for _, b := range cfg.Backends {
		l.Backends = append(l.Backends, b.Name)
	}
	return telemetry.New(l)
}

// Metrics is the process's metrics (tests read them; /metrics serves them).
func (g *Gateway) Metrics() *telemetry.Metrics { return g.metrics }

// MetricsAddr is the address of the metrics.listen listener ("" when there is none).
func (g *Gateway) MetricsAddr() string {
	if g.metricsLn == nil {
		return ""
	}
	return g.metricsLn.Addr().String()
}

// listenMetrics binds metrics.listen, before anything else is started, so a taken port fails
// the start in one line, like the API listener.
func (g *Gateway) listenMetrics() error {
	addr := g.cfg.Metrics.Listen
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &StartError{Field: "metrics.listen", Err: err, Msg: fmt.Sprintf("metrics listen %s: %v", addr, listenCause(err))}
	}
	g.metricsLn = ln
	return nil
}

// metricsReadTimeout bounds a scrape's request; the backlog read bounds the answer.
const metricsReadTimeout = 10 * time.Second

// serveMetrics serves /metrics on the metrics listener, unauthenticated (an operator binds it
// where only the scraper reaches).
func (g *Gateway) serveMetrics() {
	if g.metricsLn == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", g.metrics.Handler())
	g.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: metricsReadTimeout, ReadTimeout: metricsReadTimeout}
	g.metricsErr = make(chan error, 1)
	go func() { g.metricsErr <- g.metricsSrv.Serve(g.metricsLn) }()
	g.log.Info().Str("metrics_listen", "http://"+g.metricsLn.Addr().String()+"/metrics").Msg("metrics serving")
}

// stopMetrics stops the metrics listener (last, so a scrape sees the shutdown).
func (g *Gateway) stopMetrics(ctx context.Context) error {
	if g.metricsSrv == nil {
		if g.metricsLn != nil { // bound, never served: a start that failed later
			_ = g.metricsLn.Close()
		}
		return nil
	}
	err := g.metricsSrv.Shutdown(ctx)
	if serr := <-g.metricsErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("metrics shutdown: %w", err)
	}
	return nil
}

// jetStream is a JetStream context on nc whose API errors are counted.
func (g *Gateway) jetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	m := g.metrics
	return jetstream.New(nc, jetstream.WithClientTrace(&jetstream.ClientTrace{
		ResponseReceived: func(_ string, payload []byte, _ nats.Header) {
			// An API error answer is {"type":…,"error":{"code":…}}: cheaper to find than to decode.
			// A 404 (no such stream, consumer or message) is an answer the setup and the reads
			// expect, not a failure: a fresh start alone saw 15 of them.
			if bytes.Contains(payload, apiErrorField) && !bytes.Contains(payload, apiNotFound) {
				m.JetStreamAPIError()
			}
		},
	}))
}

var (
	apiErrorField = []byte(`"error":{`)
	apiNotFound   = []byte(`"error":{"code":404,`)
)

// jobsBacklog reads the JOBS messages the workers have not acked: pending delivery plus in
// flight, from one consumer info request per partition.
func jobsBacklog(js jetstream.JetStream, parts int) func(context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		var n uint64
		for _, p := range partition.All(parts) {
			c, err := js.Consumer(ctx, jobs.JobsStreamOf(p), workers.ConsumerName)
			if err != nil {
				return 0, err
			}
			info := c.CachedInfo()
			n += info.NumPending + uint64(info.NumAckPending)
		}
		return n, nil
	}
}
