package e2e

// Row 7 of the resilience table: the circuit breaker per backend (open → fallback without
// touching the backend; half-open probe after open_for closes it) and the route's degraded
// answer when no backend answers.

import (
	"bytes"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// switchUpstream answers 503 until healthy is set, then serves the mock.
func switchUpstream(t testing.TB) (*upstream, *atomic.Bool) {
	t.Helper()
	healthy := new(atomic.Bool)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte, h hit) bool {
		if healthy.Load() {
			return false
		}
		refuse(w, http.StatusServiceUnavailable, "")
		return true
	})
	return up, healthy
}

func TestBreakerOpensAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("waits open_for (1 s)")
	}
	t.Parallel()
	const openFor = time.Second
	up, healthy := switchUpstream(t)
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("flaky", config.TypeOpenAI, up.base(), "oncegate-mock")
	b.MaxAttempts = 1
	b.Breaker = config.Breaker{FailureRate: 0.5, Window: config.Duration(10 * time.Second), MinRequests: 4, OpenFor: config.Duration(openFor), Probes: 1}
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"flaky", "mock"}}}
	gw := gatewaykit.StartGateway(t, cfg)
	fallback := gw.Mock(t, "mock")

	n := 0
	send := func() result {
		t.Helper()
		n++
		msg := fmt.Sprintf("row 7: breaker intent %d", n)
		resp := postChat(t, gw.URL, chatBody("oncegate-mock", msg, ""), nil)
		body := resp.Body
		if resp.Status != http.StatusOK {
			t.Fatalf("intent %d: status %d: %s", n, resp.Status, body)
		}
		if got := parseCompletion(t, body).Choices[0].Message.Content; got != mockContent(t, msg) {
			t.Fatalf("intent %d: content %q", n, got)
		}
		return resp
	}

	// Closed: every intent tries flaky once (503), then falls back.
	var tripBefore time.Time
	for i := range 4 {
		if i == 3 {
			tripBefore = time.Now()
		}
		resp := send()
		if be, a := resp.Header.Get("Oncegate-Backend"), attempts(resp); be != "mock" || a != "2" {
			t.Fatalf("intent %d: backend %q attempts %q, want the fallback after one failed attempt", n, be, a)
		}
	}
	if h := len(up.Hits()); h != 4 {
		t.Fatalf("flaky attempts %d, want 4", h)
	}
	// Open (4/4 failures ≥ 0.5 with min_requests 4): served by the fallback without touching flaky.
	for range 3 {
		resp := send()
		if be, a := resp.Header.Get("Oncegate-Backend"), attempts(resp); be != "mock" || a != "1" {
			t.Fatalf("intent %d: backend %q attempts %q, want the fallback directly", n, be, a)
		}
	}
	if h := len(up.Hits()); h != 4 {
		t.Fatalf("flaky attempts %d while open, want still 4", h)
	}
	openServed := n - 4

	// Healed: after open_for a half-open probe reaches flaky, succeeds, and closes the breaker.
	healed := time.Now()
	healthy.Store(true)
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if resp := send(); resp.Header.Get("Oncegate-Backend") != "flaky" {
			openServed++
			return fmt.Errorf("traffic has not returned to flaky (%d attempts)", len(up.Hits()))
		}
		return nil
	})
	hits := up.Hits()
	if len(hits) != 5 {
		t.Errorf("flaky attempts %d, want 4 failures + 1 probe", len(hits))
	}
	if d := hits[len(hits)-1].at.Sub(tripBefore); d < openFor {
		t.Errorf("probe %v after the breaker opened, before open_for %v", d, openFor)
	}
	for range 3 {
		if resp := send(); resp.Header.Get("Oncegate-Backend") != "flaky" || attempts(resp) != "1" {
			t.Errorf("after the probe: backend %q attempts %q, want flaky (closed)", resp.Header.Get("Oncegate-Backend"), attempts(resp))
		}
	}
	if h := len(up.Hits()); h != 8 {
		t.Errorf("flaky attempts %d, want 8", h)
	}
	resilienceRow(t, "7a", "backend 100% 503, breaker {0.5, 10s, min 4, open_for 1s, probes 1}, max_attempts 1, fallback mock",
		fmt.Sprintf("failing backend: 4 attempts, then 0 while open (%d intents served by the fallback %d times); after healing: 1 probe, then all", openServed, fallback.Stats().Requests),
		fmt.Sprintf("always 200; Oncegate-Backend mock (attempts 2, then 1), flaky again %v after healing", time.Since(healed).Round(100*time.Millisecond)))
}

// All backends fail, the route has a degraded message: a normal-looking 200 marked degraded,
// never stored: a same-key retry after healing gets a real answer.
func TestBreakerDegradedMessage(t *testing.T) {
	up, healthy := switchUpstream(t)
	cfg := gatewaykit.Config(t)
	for _, name := range []string{"down-a", "down-b"} {
		b := fastRetryBackend(name, config.TypeOpenAI, up.base(), "oncegate-mock")
		b.MaxAttempts = 1
		cfg.Backends = append(cfg.Backends, b)
	}
	const degraded = "The assistant is busy right now; please try again in a minute."
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"down-a", "down-b"}, Degraded: &config.Degraded{Message: degraded}}}
	gw := gatewaykit.StartGateway(t, cfg)

	const msg, key = "row 7: everything is down", "rs-degraded"
	body := chatBody("oncegate-mock", msg, "")
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	b := resp.Body
	if resp.Status != http.StatusOK || resp.Header.Get("Oncegate-Degraded") != "true" {
		t.Fatalf("status %d Oncegate-Degraded %q: %s", resp.Status, resp.Header.Get("Oncegate-Degraded"), b)
	}
	c := parseCompletion(t, b)
	if c.Choices[0].Message.Content != degraded || c.Choices[0].Message.Role != "assistant" {
		t.Errorf("answer %+v, want the degraded message", c.Choices[0].Message)
	}
	if h := len(up.Hits()); h != 2 {
		t.Errorf("%d attempts, want one per backend", h)
	}
	if rec := idemStatus(t, gw.URL, key, nil); rec["state"] == "COMPLETED" {
		t.Errorf("the degraded answer was stored: %v", rec)
	}

	healthy.Store(true)
	resp2 := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	b2 := resp2.Body
	if resp2.Status != http.StatusOK || resp2.Header.Get("Oncegate-Degraded") != "" || resp2.Header.Get("Oncegate-Idempotency") != "created" {
		t.Fatalf("retry after healing: %d degraded %q outcome %q", resp2.Status, resp2.Header.Get("Oncegate-Degraded"), resp2.Header.Get("Oncegate-Idempotency"))
	}
	if got := parseCompletion(t, b2).Choices[0].Message.Content; got != mockContent(t, msg) {
		t.Errorf("retry after healing got %q, want the real answer", got)
	}
	resp3 := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	b3 := resp3.Body
	if resp3.Header.Get("Oncegate-Idempotency") != "replayed" || string(b3) != string(b2) {
		t.Errorf("third copy: %s, want the real answer replayed", resp3.Header.Get("Oncegate-Idempotency"))
	}
	if n := up.Mock.Stats().Requests; n != 1 {
		t.Errorf("real executions %d, want 1", n)
	}
	resilienceRow(t, "7b", "all backends 503, routes[].degraded.message", "2 refused attempts (1 per backend); after healing 1 real execution",
		fmt.Sprintf("200 Oncegate-Degraded: true with the message, not stored; same-key retry after healing: %d real answer (%s), then replayed",
			resp2.Status, resp2.Header.Get("Oncegate-Idempotency")))
}

// No degraded config: once the breaker is open and no backend can be tried, the gateway's own
// 503 with Retry-After, which an SDK may retry.
func TestBreakerNoDegradedConfig(t *testing.T) {
	up, _ := switchUpstream(t)
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("down", config.TypeOpenAI, up.base(), "oncegate-mock")
	b.MaxAttempts = 1
	b.Breaker = config.Breaker{FailureRate: 0.5, Window: config.Duration(10 * time.Second), MinRequests: 2, OpenFor: config.Duration(time.Minute), Probes: 1}
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"down"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	for i := range 2 {
		resp := postChat(t, gw.URL, chatBody("oncegate-mock", fmt.Sprintf("row 7: trip %d", i), ""), nil)
		body := resp.Body
		if resp.Status != http.StatusServiceUnavailable {
			t.Fatalf("status %d: %s", resp.Status, body)
		}
	}
	resp := postChat(t, gw.URL, chatBody("oncegate-mock", "row 7: breaker open, nothing to try", ""), map[string]string{"Idempotency-Key": "rs-no-degraded"})
	body := resp.Body
	if resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("status %d: %s", resp.Status, body)
	}
	assertOpenAIError(t, resp, "backends_unavailable")
	if ra, ms, sr := resp.Header.Get("Retry-After"), resp.Header.Get("retry-after-ms"), resp.Header.Get("x-should-retry"); ra != "1" || ms != "1000" || sr != "true" {
		t.Errorf("Retry-After %q retry-after-ms %q x-should-retry %q, want 1, 1000, true", ra, ms, sr)
	}
	if resp.Header.Get("Oncegate-Degraded") != "true" {
		t.Errorf("Oncegate-Degraded = %q", resp.Header.Get("Oncegate-Degraded"))
	}
	if h := len(up.Hits()); h != 2 {
		t.Errorf("%d attempts, want 2 (none while open)", h)
	}
	resilienceRow(t, "7c", "all backends down (breaker open), no degraded config", "0 (breaker open)",
		fmt.Sprintf("%d backends_unavailable, Retry-After: %s, x-should-retry: %s, Oncegate-Degraded: %s",
			resp.Status, resp.Header.Get("Retry-After"), resp.Header.Get("x-should-retry"), resp.Header.Get("Oncegate-Degraded")))
}

// No degraded config and every backend answers 503 (breaker still closed): the route's
// documented answer is a 503 with Retry-After that an SDK may retry (config.Route.Degraded:
// "nil = 503 with Retry-After when all backends are down").
func TestBreakerNoDegradedConfigLiveFailure(t *testing.T) {
	up, _ := switchUpstream(t)
	cfg := gatewaykit.Config(t)
	for _, name := range []string{"down-a", "down-b"} {
		b := fastRetryBackend(name, config.TypeOpenAI, up.base(), "oncegate-mock")
		b.MaxAttempts = 1
		cfg.Backends = append(cfg.Backends, b)
	}
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"down-a", "down-b"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	resp := postChat(t, gw.URL, chatBody("oncegate-mock", "row 7: all backends answer 503", ""), map[string]string{"Idempotency-Key": "rs-no-degraded-live"})
	body := resp.Body
	ra, sr := resp.Header.Get("Retry-After"), resp.Header.Get("x-should-retry")
	resilienceRow(t, "7d", "all backends 503 (breakers closed), no degraded config", fmt.Sprintf("%d refused attempts", len(up.Hits())),
		fmt.Sprintf("%d %s Retry-After: %q, x-should-retry: %q", resp.Status, bytes.TrimSpace(body), ra, sr))
	if resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("status %d: %s", resp.Status, body)
	}
	if ra == "" || sr != "true" {
		t.Fatalf("%s (Retry-After %q, x-should-retry %q)", liveDegradedBug, ra, sr)
	}
}

const liveDegradedBug = "regression: with no degraded config and every backend answering 503, the client gets the last backend's 503 passed through without Retry-After and with " +
	"x-should-retry: false (workers/dispatch.go degrade: the gateway's 503 + Retry-After only when `ex.job.DegradedRetryAfter > 0 || last == nil`, i.e. when no backend was tried), " +
	"although the key was released (a retry is safe) and config.Route.Degraded documents nil = 503 with Retry-After when all backends are down"
