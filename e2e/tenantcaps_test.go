package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// capTenants are tenant x, whose streams are capped at streamCap across the deployment, and
// tenant y, uncapped, with the API keys sk-x and sk-y.
func capTenants(cfg *config.Config, streamCap int) {
	for _, id := range []string{"x", "y"} {
		sum := sha256.Sum256([]byte("sk-" + id))
		tn := config.Tenant{ID: id, APIKeysSHA256: []string{hex.EncodeToString(sum[:])}}
		if id == "x" {
			tn.Limits.Streams = streamCap
		}
		cfg.Tenants = append(cfg.Tenants, tn)
	}
	cfg.Admission.APINodes = 2
}

// ttfb sends a new streamed intent as tenant y and returns its time to first byte; the stream
// must be answered 200 and end with [DONE].
func ttfb(url, msg string) (time.Duration, error) {
	start := time.Now()
	resp, err := openStream(http.MethodPost, url+chatPath, chatBody("oncegate-mock", msg, `"stream":true`),
		map[string]string{"Authorization": "Bearer sk-y"})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err != nil {
		return 0, err
	}
	first := time.Since(start)
	var b strings.Builder
	if _, err := br.WriteTo(&b); err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasSuffix(strings.TrimSpace(b.String()), "data: [DONE]") {
		return 0, fmt.Errorf("status %d: %.300s", resp.StatusCode, b.String())
	}
	return first, nil
}

// TestTenantStreamCapAcrossNodes (issue 17): two API nodes, each also a worker, share one
// NATS and admission.api_nodes 2; tenant x's cap is 4 streams, so each node admits 2. x opens
// 40 streams (10× its cap) at once, split across the nodes: at most 4 are admitted in all,
// every other one is a 429 with Retry-After, x-should-retry and rate_limit_exceeded, and the
// backend runs no more of them than were admitted. Tenant y, uncapped, streams new intents
// alone twice (the run-to-run noise) and then while x floods both nodes: it sees no error,
// and its p99 time to first byte in each phase (200 streams) is logged as ratios (for BENCHMARKS.md, not
// asserted: a time is not a unit test's business).
func TestTenantStreamCapAcrossNodes(t *testing.T) {
	acfg := gatewaykit.Config(t)
	acfg.NATS.Listen = "127.0.0.1:0"
	capTenants(acfg, 4)
	a := gatewaykit.StartGateway(t, acfg)
	bcfg := gatewaykit.Config(t)
	bcfg.NATS.URL = a.NATSURL()
	capTenants(bcfg, 4)
	b := gatewaykit.StartGateway(t, bcfg)
	nodes := []string{a.URL, b.URL}
	slowA, slowB := a.Mock(t, "slowmock"), b.Mock(t, "slowmock")
	ran := func() int64 { return slowA.Stats().Requests + slowB.Stats().Requests }

	// x's flood: 40 new streams (~2 s each) at once, alternating between the nodes.
	flood := func(round string) (admitted, refused int) {
		t.Helper()
		const n = 40
		results := make([]result, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				results[i] = send(http.MethodPost, nodes[i%2]+chatPath, slowBody(fmt.Sprintf("x %s %d", round, i), true),
					map[string]string{"Authorization": "Bearer sk-x"})
			})
		}
		wg.Wait()
		for i, r := range results {
			switch {
			case r.Err != nil:
				t.Fatalf("x stream %d: %v", i, r.Err)
			case r.Status == http.StatusOK:
				if !strings.HasSuffix(strings.TrimSpace(string(r.Body)), "data: [DONE]") {
					t.Fatalf("x stream %d admitted but not whole: %.300s", i, r.Body)
				}
				admitted++
			case r.Status == http.StatusTooManyRequests:
				if r.Header.Get("Retry-After") == "" || r.Header.Get("x-should-retry") != "true" {
					t.Fatalf("x stream %d: 429 with Retry-After %q and x-should-retry %q", i, r.Header.Get("Retry-After"), r.Header.Get("x-should-retry"))
				}
				assertOpenAIError(t, r, "rate_limit_exceeded")
				refused++
			default:
				t.Fatalf("x stream %d: status %d: %s", i, r.Status, r.Body)
			}
		}
		return admitted, refused
	}
	before := ran()
	admitted, refused := flood("alone")
	t.Logf("x, 40 streams against a cap of 4 on 2 nodes: %d admitted, %d refused with 429", admitted, refused)
	if admitted > 4 || admitted < 2 {
		t.Fatalf("%d of x's streams admitted at once on 2 nodes with a cap of 4; want 2 to 4 (no more than the cap)", admitted)
	}
	if got := ran() - before; got != int64(admitted) {
		t.Fatalf("the backend ran %d of x's executions for %d admitted streams", got, admitted)
	}

	// y's phases: 200 new streams each, 4 at a time, spread over both nodes.
	phase := func(name string) time.Duration {
		t.Helper()
		lat := make([]time.Duration, 200)
		errs := make(chan error, len(lat))
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := w; i < len(lat); i += 4 {
					d, err := ttfb(nodes[i%2], fmt.Sprintf("y %s %d", name, i))
					if err != nil {
						errs <- fmt.Errorf("y request %d of %s: %w", i, name, err)
						return
					}
					lat[i] = d
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return percentile(lat, 99)
	}
	alone1 := phase("alone 1")
	alone2 := phase("alone 2")
	stop := make(chan struct{})
	var floods sync.WaitGroup
	var floodRefused, floodAdmitted int
	var mu sync.Mutex
	for w := range 40 { // x keeps 40 streams in flight or refused: 10× its cap
		floods.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := send(http.MethodPost, nodes[(w+i)%2]+chatPath, slowBody(fmt.Sprintf("x during %d %d", w, i), true),
					map[string]string{"Authorization": "Bearer sk-x"})
				mu.Lock()
				switch r.Status {
				case http.StatusOK:
					floodAdmitted++
				case http.StatusTooManyRequests:
					floodRefused++
				}
				mu.Unlock()
				if r.Status == http.StatusTooManyRequests {
					time.Sleep(5 * time.Millisecond) // a client that ignores Retry-After, nearly
				}
			}
		})
	}
	for refusedYet := false; !refusedYet; time.Sleep(5 * time.Millisecond) { // the flood is on
		mu.Lock()
		refusedYet = floodRefused > 0
		mu.Unlock()
	}
	during := phase("during x's flood")
	close(stop)
	floods.Wait()
	noise := float64(alone2) / float64(alone1)
	t.Logf("y p99 TTFB: alone %s and %s (run-to-run ratio %.2f), during x's flood %s (ratio to the mean alone %.2f); x during: %d admitted, %d refused",
		alone1, alone2, noise, during, float64(during)/(float64(alone1+alone2)/2), floodAdmitted, floodRefused)
	if floodRefused == 0 {
		t.Fatal("x's flood during y's phase was never refused")
	}
}

// TestJobEventStreamsCountAgainstTheStreamCap: a tenant's event streams of a live background
// job (GET /v1/jobs/{id}/events) hold its streams like streamed answers do: with a cap of 2,
// two are served, a third is a 429, and once one has ended another is served.
func TestJobEventStreamsCountAgainstTheStreamCap(t *testing.T) {
	cfg := gatewaykit.Config(t)
	capTenants(cfg, 2)
	cfg.Admission.APINodes = 1
	gw := gatewaykit.StartGateway(t, cfg)
	auth := map[string]string{"Authorization": "Bearer sk-x", "Prefer": "respond-async"}
	r := send(http.MethodPost, gw.URL+chatPath, chatBody(slowModel, "events cap", `"mock":{"tokens":40,"inter_token_ms":50}`), auth) // 2 s
	if r.Status != http.StatusAccepted {
		t.Fatalf("job: status %d: %s", r.Status, r.Body)
	}
	events := gw.URL + "/v1/jobs/" + r.Header.Get("Oncegate-Job-Id") + "/events"
	open := func() (*http.Response, error) {
		return openStream(http.MethodGet, events, "", map[string]string{"Authorization": "Bearer sk-x"})
	}
	var held []*http.Response
	for i := range 2 {
		resp, err := open()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("events stream %d: %v %v", i, err, resp)
		}
		held = append(held, resp)
	}
	third := send(http.MethodGet, events, "", map[string]string{"Authorization": "Bearer sk-x"})
	if third.Status != http.StatusTooManyRequests || third.Header.Get("Retry-After") == "" {
		t.Fatalf("a third events stream at a cap of 2: status %d, Retry-After %q: %s", third.Status, third.Header.Get("Retry-After"), third.Body)
	}
	assertOpenAIError(t, third, "rate_limit_exceeded")
	var b strings.Builder
	if _, err := bufio.NewReader(held[0].Body).WriteTo(&b); err != nil || !strings.Contains(b.String(), "[DONE]") {
		t.Fatalf("the first events stream: %v: %.300s", err, b.String())
	}
	held[0].Body.Close()
	held[1].Body.Close()
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error { // the streams are given back when they end
		if r := send(http.MethodGet, events, "", map[string]string{"Authorization": "Bearer sk-x"}); r.Status != http.StatusOK && r.Status != http.StatusNoContent {
			return fmt.Errorf("events after the streams ended: status %d: %s", r.Status, r.Body)
		}
		return nil
	})
}
