package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestMain checks that every goroutine a run starts is joined. fasthttp (under the gateway
// of TestAgainstGateway) keeps a process-wide clock goroutine, and its worker-pool cleaner
// outlives a stopped server by up to 10 s; neither belongs to this package.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

// startMock serves a fresh oncegate mock on 127.0.0.1.
func startMock(t *testing.T) (*httptest.Server, *mockllm.Server) {
	t.Helper()
	m := mockllm.New(mockllm.Options{Models: []string{"oncegate-mock", "oncegate-mock-slow"}})
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return srv, m
}

// brief is a short run against url: 300 ms, concurrency 4, at most 200 requests, no warm-up.
func brief(url, scenario string) Config {
	c := DefaultConfig()
	c.URL, c.Scenario = url, scenario
	c.Duration, c.Warmup, c.Concurrency, c.MaxRequests = 300*time.Millisecond, 0, 4, 200
	c.Timeout = 20 * time.Second
	return c
}

func ptr[T any](v T) *T { return &v }

func run(t *testing.T, c Config) *Report {
	t.Helper()
	rep, err := Run(context.Background(), c)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.Targets) == 0 {
		t.Fatal("no targets in the report")
	}
	// Every report must render both ways.
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	buf.Reset()
	if err := WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("the JSON report does not parse: %v", err)
	}
	return rep
}

// consistent checks the counts every result must satisfy.
func consistent(t *testing.T, r *Result) {
	t.Helper()
	var errs int64
	for _, n := range r.Errors {
		errs += n
	}
	if r.Requests == 0 {
		t.Errorf("%s: no requests", r.Label)
	}
	if r.Requests != r.Successes+errs {
		t.Errorf("%s: requests %d != successes %d + errors %d (%v)", r.Label, r.Requests, r.Successes, errs, r.Errors)
	}
	if int64(r.Latency.Count) != r.Successes {
		t.Errorf("%s: %d latency samples for %d successes", r.Label, r.Latency.Count, r.Successes)
	}
	if r.Requests > 200 {
		t.Errorf("%s: %d requests, above --max-requests 200", r.Label, r.Requests)
	}
}

func wantExec(t *testing.T, r *Result, perRequest, perIntent float64) {
	t.Helper()
	if r.ExecError != "" {
		t.Fatalf("%s: executions not counted: %s", r.Label, r.ExecError)
	}
	if r.ExecPerRequest == nil || r.ExecPerIntent == nil {
		t.Fatalf("%s: executions per request/intent missing", r.Label)
	}
	if perRequest > 0 && *r.ExecPerRequest != perRequest {
		t.Errorf("%s: executions/request = %v, want %v (executions %d, requests %d)", r.Label, *r.ExecPerRequest, perRequest, *r.Executions, r.Requests)
	}
	if perIntent > 0 && *r.ExecPerIntent != perIntent {
		t.Errorf("%s: executions/intent = %v, want %v (executions %d, intents %d)", r.Label, *r.ExecPerIntent, perIntent, *r.Executions, r.Intents)
	}
}

func TestScenariosAgainstMock(t *testing.T) {
	t.Run("overhead", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioOverhead)
		c.MockStatsURL = srv.URL
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.Successes != r.Requests || r.Intents != r.Requests {
			t.Errorf("requests %d, successes %d, intents %d: want all equal", r.Requests, r.Successes, r.Intents)
		}
		wantExec(t, r, 1, 1)
	})
	t.Run("overhead stream", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioOverhead)
		c.Stream, c.MockStatsURL = true, srv.URL+"/v1"
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.TTFT == nil || r.TTLT == nil || int64(r.TTFT.Count) != r.Successes || int64(r.TTLT.Count) != r.Successes {
			t.Errorf("ttft/ttlt samples %+v %+v for %d successes", r.TTFT, r.TTLT, r.Successes)
		}
		if r.TTLT.P50 < r.TTFT.P50 {
			t.Errorf("ttlt p50 %s < ttft p50 %s", r.TTLT.P50, r.TTFT.P50)
		}
		wantExec(t, r, 1, 1)
	})
	t.Run("duplicates without dedup", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioDuplicates)
		c.Copies, c.MockStatsURL = 3, srv.URL
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.Requests != 3*r.Intents {
			t.Errorf("requests %d != 3 × intents %d", r.Requests, r.Intents)
		}
		if r.Divergent == nil || *r.Divergent != 0 {
			t.Errorf("divergent = %v, want 0 (the mock is deterministic)", r.Divergent)
		}
		wantExec(t, r, 1, 3)
	})
	t.Run("duplicates without keys", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioDuplicates)
		c.Copies, c.Keys, c.MockStatsURL = 2, ptr(false), srv.URL
		rep := run(t, c)
		if rep.Keys {
			t.Error("report says keys were sent")
		}
		r := &rep.Targets[0]
		consistent(t, r)
		wantExec(t, r, 1, 2)
	})
	t.Run("retry-storm", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioRetryStorm)
		c.Concurrency, c.MockStatsURL = 2, srv.URL
		// The mock answers after 10 s, the client gives up on an attempt after 50 ms of silence.
		c.Mock.TTFT, c.ClientTimeout = ptr(10*time.Second), 50*time.Millisecond
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.Retries != 2*r.Intents {
			t.Errorf("retries %d, want 2 per call (%d calls): every attempt times out", r.Retries, r.Intents)
		}
		if r.Requests != r.Intents+r.Retries {
			t.Errorf("requests %d != calls %d + retries %d", r.Requests, r.Intents, r.Retries)
		}
		if r.IntentsOK != 0 || r.Errors[string(KindTimeout)] != r.Requests {
			t.Errorf("calls ok %d, errors %v: want every attempt to time out", r.IntentsOK, r.Errors)
		}
		wantExec(t, r, 1, 3)
		if *r.Executions <= r.Intents {
			t.Errorf("executions %d <= calls %d: a plain backend runs every retry", *r.Executions, r.Intents)
		}
	})
	t.Run("retry-storm honors Retry-After", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioRetryStorm)
		c.Concurrency, c.Retries, c.MockStatsURL = 1, 1, srv.URL
		c.Mock.Fault = "rate_limit" // 429, Retry-After: 1, retry-after-ms: 1000
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.Errors[string(KindHTTP4xx)] != r.Requests || r.Retries != r.Intents {
			t.Errorf("errors %v, retries %d, calls %d: want one retry per call, all 429", r.Errors, r.Retries, r.Intents)
		}
		wantExec(t, r, 1, 2)
	})
	t.Run("fanout", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioFanout)
		c.Concurrency, c.Subscribers, c.MockStatsURL = 2, 3, srv.URL
		c.Mock.Tokens, c.Mock.InterToken = ptr(20), ptr(2*time.Millisecond)
		rep := run(t, c)
		if !rep.Stream {
			t.Error("fanout did not stream")
		}
		r := &rep.Targets[0]
		consistent(t, r)
		f := r.Fanout
		if f == nil || f.Rounds == 0 || f.Rounds != r.Intents {
			t.Fatalf("fanout = %+v, intents %d", f, r.Intents)
		}
		if f.Subscribers != 3*f.Rounds || f.Complete != f.Subscribers || f.Mismatched != 0 {
			t.Errorf("subscribers %d, complete %d, mismatched %d over %d rounds: want 3 complete per round", f.Subscribers, f.Complete, f.Mismatched, f.Rounds)
		}
		// The mock's stream: a role chunk, 20 token chunks, a finish chunk.
		if f.ChunksPerStream != 22 {
			t.Errorf("chunks per stream = %d, want 22", f.ChunksPerStream)
		}
		if f.Lag.Count != int(f.Subscribers)*f.ChunksPerStream {
			t.Errorf("lag samples %d, want %d", f.Lag.Count, int(f.Subscribers)*f.ChunksPerStream)
		}
		if r.Requests != 4*f.Rounds {
			t.Errorf("requests %d != 4 × rounds %d", r.Requests, f.Rounds)
		}
		wantExec(t, r, 1, 4)
	})
	t.Run("replay", func(t *testing.T) {
		srv, m := startMock(t)
		c := brief(srv.URL, ScenarioReplay)
		c.KeysPool, c.MockStatsURL = 10, srv.URL
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.Successes != r.Requests {
			t.Errorf("replay: %d of %d requests failed: %v", r.Requests-r.Successes, r.Requests, r.Errors)
		}
		if got := m.Stats().Requests; got != 10+r.Requests {
			t.Errorf("mock executions %d, want pool 10 + measured %d", got, r.Requests)
		}
		wantExec(t, r, 1, 1) // a plain backend executes every replay
	})
	t.Run("open loop", func(t *testing.T) {
		srv, _ := startMock(t)
		c := brief(srv.URL, ScenarioOverhead)
		c.Rate = 200
		rep := run(t, c)
		r := &rep.Targets[0]
		consistent(t, r)
		if rep.Loop != "open" {
			t.Errorf("loop = %q", rep.Loop)
		}
		// Arrivals are scheduled at i/200 s for i/200 < 0.3 s: at most 60.
		if n := r.Requests + r.Skipped; n > 60 {
			t.Errorf("requests %d + skipped %d > 60 scheduled arrivals", r.Requests, r.Skipped)
		}
	})
	t.Run("max requests cap", func(t *testing.T) {
		srv, m := startMock(t)
		c := brief(srv.URL, ScenarioDuplicates)
		c.Duration, c.Warmup, c.MaxRequests, c.Copies = time.Minute, time.Minute, 12, 5
		r := &run(t, c).Targets[0]
		// Warm-up takes 10 (two intents of 5); the next intent of 5 would pass the cap.
		if got := m.Stats().Requests; got != 10 || r.Requests != 0 {
			t.Errorf("mock saw %d requests, measured %d: want 10 and 0 (the cap ends the run)", got, r.Requests)
		}
	})
}

func TestCompareInterleaved(t *testing.T) {
	srvA, mA := startMock(t)
	// B knows its model only by a router's name for it: each target gets its own model.
	mB := mockllm.New(mockllm.Options{Models: []string{"openai/oncegate-mock"}})
	srvB := httptest.NewServer(mB)
	t.Cleanup(srvB.Close)
	c := brief(srvA.URL, ScenarioOverhead)
	c.CompareURL, c.Slice, c.Duration = srvB.URL, 100*time.Millisecond, 300*time.Millisecond
	c.CompareModel = "openai/oncegate-mock"
	c.Executions = func(context.Context) (int64, error) { return mA.Stats().Requests + mB.Stats().Requests, nil }
	rep := run(t, c)
	if len(rep.Targets) != 2 || rep.Compare == nil {
		t.Fatalf("targets %d, compare %v", len(rep.Targets), rep.Compare)
	}
	for i, m := range []*mockllm.Server{mA, mB} {
		r := &rep.Targets[i]
		consistent(t, r)
		if r.Successes != r.Requests {
			t.Errorf("%s: %d of %d requests failed: %v", r.Label, r.Requests-r.Successes, r.Requests, r.Errors)
		}
		// One counter for both targets: the slices are separated, so each gets its own.
		if *r.Executions != m.Stats().Requests || *r.Executions != r.Requests {
			t.Errorf("%s: executions %d, its mock %d, requests %d: want equal", r.Label, *r.Executions, m.Stats().Requests, r.Requests)
		}
	}
	if rep.Compare.RequestsPerSecRatio == nil || rep.Compare.Latency == nil || rep.Compare.Latency.P50.Ratio == nil {
		t.Errorf("compare lacks ratios: %+v", rep.Compare)
	}
}

func TestConfigRefusals(t *testing.T) {
	srv, m := startMock(t)
	tests := []struct {
		name   string
		modify func(*Config)
		want   error
		text   string
	}{
		{"remote target", func(c *Config) { c.URL = "http://10.0.0.1:8080" }, ErrNotLoopback, ""},
		{"remote compare", func(c *Config) { c.CompareURL = "http://192.0.2.7" }, ErrNotLoopback, ""},
		{"remote stats", func(c *Config) { c.MockStatsURL = "http://192.0.2.7" }, ErrNotLoopback, ""},
		{"too long", func(c *Config) { c.Duration = 11 * time.Minute }, ErrConfig, "--allow-long"},
		{"too many", func(c *Config) { c.MaxRequests = MaxRequestsCap + 1 }, ErrConfig, "--allow-long"},
		{"unknown scenario", func(c *Config) { c.Scenario = "chaos" }, ErrConfig, "--scenario"},
		{"compare model alone", func(c *Config) { c.CompareModel = "openai/oncegate-mock" }, ErrConfig, "--compare-model"},
		{"zero concurrency", func(c *Config) { c.Concurrency = 0 }, ErrConfig, "--concurrency"},
		{"huge prompt", func(c *Config) { c.PromptBytes = MaxPromptBytes + 1 }, ErrConfig, "--prompt-bytes"},
		{"client timeout above timeout", func(c *Config) {
			c.Scenario, c.ClientTimeout, c.Timeout = ScenarioRetryStorm, time.Minute, time.Second
		}, ErrConfig, "--client-timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := brief(srv.URL, ScenarioOverhead)
			tt.modify(&c)
			rep, err := Run(context.Background(), c)
			if !errors.Is(err, tt.want) || rep != nil || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("Run = %v, %v; want %v mentioning %q", rep, err, tt.want, tt.text)
			}
		})
	}
	if n := m.Stats().Requests; n != 0 {
		t.Errorf("a refused run sent %d requests", n)
	}
}

func TestSetupFailure(t *testing.T) {
	srv, _ := startMock(t)
	c := brief(srv.URL, ScenarioReplay)
	c.KeysPool, c.Model = 3, "no-such-model" // the mock answers 404
	if _, err := Run(context.Background(), c); !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "3 of 3") {
		t.Fatalf("Run = %v, want ErrSetup (3 of 3 failed)", err)
	}
}

func TestCutShort(t *testing.T) {
	srv, _ := startMock(t)
	c := brief(srv.URL, ScenarioOverhead)
	c.Duration = time.Minute
	c.Mock.TTFT = ptr(time.Hour) // every request stalls until canceled
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	rep, err := Run(ctx, c)
	if !errors.Is(err, ErrCutShort) || !errors.Is(err, context.Canceled) || rep == nil || rep.CutShort == "" {
		t.Fatalf("Run = %+v, %v; want a partial report and ErrCutShort", rep, err)
	}
	r := &rep.Targets[0]
	if r.Requests != 4 || r.Errors[string(KindCanceled)] != 4 {
		t.Errorf("requests %d, errors %v: want the 4 stalled requests canceled", r.Requests, r.Errors)
	}
}

// TestAgainstGateway runs duplicates and retry-storm against a whole in-process gateway:
// every copy and every SDK retry of one intent must cost one backend execution.
func TestAgainstGateway(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	counter := func(name string) func(context.Context) (int64, error) {
		m := gw.Mock(t, name)
		return func(context.Context) (int64, error) { return m.Stats().Requests, nil }
	}

	t.Run("duplicates with keys", func(t *testing.T) {
		c := brief(gw.URL, ScenarioDuplicates)
		c.Copies, c.Keys, c.Executions = 5, ptr(true), counter("mock")
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.Successes != r.Requests {
			t.Errorf("%d of %d copies failed: %v %v", r.Requests-r.Successes, r.Requests, r.Errors, r.ErrorSamples)
		}
		wantExec(t, r, 0, 1)
		if r.Divergent == nil || *r.Divergent != 0 {
			t.Errorf("divergent intents = %v: every copy must get the same body", r.Divergent)
		}
		if r.Idempotency["created"] != r.Intents {
			t.Errorf("idempotency answers %v: want one created per intent (%d)", r.Idempotency, r.Intents)
		}
	})

	t.Run("retry-storm on a slow model", func(t *testing.T) {
		c := brief(gw.URL, ScenarioRetryStorm)
		c.Model, c.ClientTimeout, c.Executions = "oncegate-mock-slow", 100*time.Millisecond, counter("slowmock")
		r := &run(t, c).Targets[0]
		consistent(t, r)
		if r.IntentsOK != r.Intents {
			t.Errorf("%d of %d calls never got an answer: %v %v", r.Intents-r.IntentsOK, r.Intents, r.Errors, r.ErrorSamples)
		}
		if r.Requests != r.Intents+r.Retries {
			t.Errorf("requests %d != calls %d + retries %d", r.Requests, r.Intents, r.Retries)
		}
		wantExec(t, r, 0, 1)
		// A 320 ms model and a 100 ms client timeout make every first attempt time out, unless
		// the machine stalls the client's timer for longer than the model runs.
		if r.Retries == 0 {
			t.Logf("no attempt timed out (a stalled machine?): the retries were not exercised")
		}
	})
}
