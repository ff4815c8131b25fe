package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// Benchmarks of the whole path (HTTP → claim → JOBS → worker → mock → CHUNKS → HTTP) against
// the same mock called directly over HTTP on 127.0.0.1, in the same run. Compare
// BenchmarkGatewayX/Y with BenchmarkDirectMockX/Y for the gateway's overhead. Each has a
// serial sub-benchmark (latency of one request at a time) and a parallel one (16 concurrent
// clients per GOMAXPROCS: throughput). execs/op is the mock's executions per request.
//
//	go test -run XXX -bench . -benchtime 2s ./e2e/

// benchParallelism is RunParallel's goroutines per GOMAXPROCS.
const benchParallelism = 16

// benchClient is a client with enough idle connections for the parallel benchmarks; its
// connections are closed when the benchmark ends.
func benchClient(b *testing.B) *http.Client {
	c := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}}
	b.Cleanup(c.CloseIdleConnections)
	return c
}

// benchPost sends one request and drains the response; it reports failures with b.Error
// (it runs in RunParallel goroutines) and returns the outcome header.
func benchPost(b *testing.B, c *http.Client, url, body, key string) (ok bool, outcome string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		b.Error(err)
		return false, ""
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		b.Error(err)
		return false, ""
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n == 0 {
		b.Errorf("status %d, %d bytes, err %v", resp.StatusCode, n, err)
		return false, ""
	}
	return true, resp.Header.Get("Oncegate-Idempotency")
}

// runDirect benchmarks the mock behind httptest.NewServer (a real 127.0.0.1 listener).
func runDirect(b *testing.B, extra string) {
	body := chatBody("oncegate-mock", "bench", extra)
	for _, mode := range []string{"serial", "parallel"} {
		b.Run(mode, func(b *testing.B) {
			srv := httptest.NewServer(mockllm.New(mockllm.Options{}))
			defer srv.Close()
			c := benchClient(b)
			url := srv.URL + chatPath
			drive(b, mode, func() bool {
				ok, _ := benchPost(b, c, url, body, "")
				return ok
			})
		})
	}
}

// runGateway benchmarks a whole in-process gateway. Each request is a new intent (a unique
// Idempotency-Key) unless replay is set; then every request replays one completed key.
func runGateway(b *testing.B, extra string, replay bool) { runGatewaySync(b, extra, replay, "always") }

// runGatewaySync is runGateway with the embedded server's nats.sync set to sync.
func runGatewaySync(b *testing.B, extra string, replay bool, sync string) {
	body := chatBody("oncegate-mock", "bench", extra)
	for _, mode := range []string{"serial", "parallel"} {
		b.Run(mode, func(b *testing.B) {
			cfg := gatewaykit.Config(b)
			cfg.NATS.Sync = sync
			gw := gatewaykit.StartGateway(b, cfg)
			mock := gw.Mock(b, "mock")
			c := benchClient(b)
			url := gw.URL + chatPath
			var run [8]byte
			_, _ = rand.Read(run[:])
			prefix := "bench-" + hex.EncodeToString(run[:]) + "-"
			wantOutcome := "created"
			if replay {
				wantOutcome = "replayed"
				if ok, outcome := benchPost(b, c, url, body, prefix+"replay"); !ok || outcome != "created" {
					b.Fatalf("priming request: ok %v outcome %q", ok, outcome)
				}
			}
			var seq atomic.Int64
			key := func() string {
				if replay {
					return prefix + "replay"
				}
				return prefix + strconv.FormatInt(seq.Add(1), 10)
			}
			before := mock.Stats().Requests
			drive(b, mode, func() bool {
				ok, outcome := benchPost(b, c, url, body, key())
				if ok && outcome != wantOutcome {
					b.Errorf("Oncegate-Idempotency = %q, want %q", outcome, wantOutcome)
					return false
				}
				return ok
			})
			execs := mock.Stats().Requests - before
			b.ReportMetric(float64(execs)/float64(b.N), "execs/op")
			if want := int64(b.N); !replay && execs != want {
				b.Errorf("%d backend executions for %d new intents", execs, want)
			}
			if replay && execs != 0 {
				b.Errorf("%d backend executions for %d replays, want 0", execs, b.N)
			}
		})
	}
}

// BenchmarkDirectMock: the mock alone, non-stream, over 127.0.0.1.
func BenchmarkDirectMock(b *testing.B) { runDirect(b, "") }

// BenchmarkDirectMockStream: the mock alone, stream (16 tokens, no delay), over 127.0.0.1.
func BenchmarkDirectMockStream(b *testing.B) { runDirect(b, `"stream":true`) }

// BenchmarkGatewayNonStream: a new intent per request through the whole gateway.
func BenchmarkGatewayNonStream(b *testing.B) { runGateway(b, "", false) }

// BenchmarkGatewayNonStreamSync1s: as BenchmarkGatewayNonStream with state writes fsynced
// every second instead of before each acknowledgement (the documented short-interval setting).
func BenchmarkGatewayNonStreamSync1s(b *testing.B) { runGatewaySync(b, "", false, "1s") }

// BenchmarkGatewayStream: a new streamed intent per request through the whole gateway.
func BenchmarkGatewayStream(b *testing.B) { runGateway(b, `"stream":true`, false) }

// BenchmarkGatewayReplay: every request repeats one completed key (served from the record).
func BenchmarkGatewayReplay(b *testing.B) { runGateway(b, "", true) }

// drive runs one b.N times, serially or from parallel goroutines (mode), and reports the p50
// and p99 of its latencies, which the ns/op mean hides. It stops at the first failure.
func drive(b *testing.B, mode string, one func() bool) {
	lat := make([]time.Duration, b.N)
	var done atomic.Int64
	timed := func() bool {
		start := time.Now()
		ok := one()
		if i := done.Add(1) - 1; i < int64(len(lat)) {
			lat[i] = time.Since(start)
		}
		return ok
	}
	b.ReportAllocs()
	b.ResetTimer()
	if mode == "serial" {
		for i := 0; i < b.N; i++ {
			if !timed() {
				break
			}
		}
	} else {
		b.SetParallelism(benchParallelism)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !timed() {
					return
				}
			}
		})
	}
	b.StopTimer()
	reportPercentiles(b, lat[:min(done.Load(), int64(len(lat)))])
}

// reportPercentiles adds the p50 and p99 of the requests' latencies to the benchmark's output
// (a report, never a threshold).
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}
