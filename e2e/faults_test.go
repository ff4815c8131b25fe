package e2e

// Resilience: one test per row of the retry rules (workers/dispatch.go), each asserting the
// backend executions of the intent and what the client sees. Every row logs one line
// "RESILIENCE row N | fault | executions | client outcome"; the table is
//
//	go test -count=1 -v -run 'TestFault|TestBreaker|TestContinuation|TestChain' ./e2e/ | grep 'RESILIENCE row'

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// Row 1: connection refused is never a run: retried up to max_attempts, then the next backend
// of the route; with no next backend the client gets 502 backend_unreachable.
func TestFaultConnectionRefused(t *testing.T) {
	cfg := gatewaykit.Config(t)
	// A free port that nothing listens on: connection refused.
	cfg.Backends = append(cfg.Backends,
		fastRetryBackend("refused", config.TypeOpenAI, "http://"+testkit.FreeAddr(t)+"/v1", "oncegate-mock"),
		fastRetryBackend("refused-alone", config.TypeOpenAI, "http://"+testkit.FreeAddr(t)+"/v1", "oncegate-refused"))
	cfg.Routes = []config.Route{
		{Model: "oncegate-mock", Backends: []string{"refused", "mock"}},
		{Model: "oncegate-refused", Backends: []string{"refused-alone"}},
	}
	gw := gatewaykit.StartGateway(t, cfg)
	mock, slow := gw.Mock(t, "mock"), gw.Mock(t, "slowmock")

	t.Run("fallback", func(t *testing.T) {
		const msg = "row 1: refused, then the fallback"
		resp := postChat(t, gw.URL, chatBody("oncegate-mock", msg, ""), map[string]string{"Idempotency-Key": "rs-refused-fallback"})
		b := resp.Body
		if resp.Status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.Status, b)
		}
		if got := parseCompletion(t, b).Choices[0].Message.Content; got != mockContent(t, msg) {
			t.Errorf("content %q is not the fallback mock's answer", got)
		}
		if be := resp.Header.Get("Oncegate-Backend"); be != "mock" {
			t.Errorf("Oncegate-Backend = %q, want mock", be)
		}
		// max_attempts (3) on the refused backend, then one on the fallback.
		if a := attempts(resp); a != "4" {
			t.Errorf("Oncegate-Attempts = %q, want 4 (3 refused + 1 fallback)", a)
		}
		if n := mock.Stats().Requests; n != 1 {
			t.Errorf("fallback executions = %d, want 1", n)
		}
		resilienceRow(t, "1a", "connection refused on A (openai, closed port), fallback mock B", "A: 0 (3 attempts refused), B: 1",
			fmt.Sprintf("%d, Oncegate-Backend: %s, Oncegate-Attempts: %s", resp.Status, resp.Header.Get("Oncegate-Backend"), attempts(resp)))
	})

	t.Run("no fallback", func(t *testing.T) {
		before := mock.Stats().Requests + slow.Stats().Requests
		body := chatBody("oncegate-refused", "row 1: refused, nowhere else to go", "")
		resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "rs-refused-alone"})
		b := resp.Body
		if resp.Status != http.StatusBadGateway {
			t.Fatalf("status %d: %s", resp.Status, b)
		}
		assertOpenAIError(t, resp, "backend_unreachable")
		if a := attempts(resp); a != "3" {
			t.Errorf("Oncegate-Attempts = %q, want max_attempts 3 (a refused connection is always safe to retry)", a)
		}
		if n := mock.Stats().Requests + slow.Stats().Requests - before; n != 0 {
			t.Errorf("%d executions on other backends", n)
		}
		if st := idemStatus(t, gw.URL, "rs-refused-alone", nil); st["state"] != "FAILED" {
			t.Errorf("record %v, want FAILED", st)
		}
		resilienceRow(t, "1b", "connection refused, no fallback", "0 anywhere (3 attempts refused)",
			fmt.Sprintf("%d backend_unreachable, Oncegate-Attempts: %s, x-should-retry: %s", resp.Status, attempts(resp), resp.Header.Get("x-should-retry")))

		// Nothing ran: the key was released, and a retry executes (tries) again.
		resp2 := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "rs-refused-alone"})
		b2 := resp2.Body
		if resp2.Status != http.StatusBadGateway || resp2.Header.Get("Oncegate-Idempotency") != "created" {
			t.Errorf("same-key retry: %d %s %s, want a new 502 execution (created)", resp2.Status, resp2.Header.Get("Oncegate-Idempotency"), b2)
		}
	})
}

// Row 2a: the request was written and the backend went silent: the attempt waits for the
// backend's whole timeout (first_byte_timeout alone proves nothing without a deduplicating
// backend), then 504 backend_timeout; never re-sent.
func TestFaultStallBeforeFirstByte(t *testing.T) {
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("stallmock", config.TypeMock, "", "oncegate-mock")
	b.FirstByteTimeout, b.Timeout = config.Duration(200*time.Millisecond), config.Duration(time.Second)
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"stallmock", "mock"}}}
	gw := gatewaykit.StartGateway(t, cfg)
	stall, fallback := gw.Mock(t, "stallmock"), gw.Mock(t, "mock")

	const key = "rs-stall"
	body := mockBody("row 2: accept, then stall", `{"fault":"stall"}`, "")
	start := time.Now()
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	rb := resp.Body
	elapsed := time.Since(start)
	if resp.Status != http.StatusGatewayTimeout {
		t.Fatalf("status %d: %s", resp.Status, rb)
	}
	assertOpenAIError(t, resp, "backend_timeout")
	if elapsed < time.Second {
		t.Errorf("answered after %v: before the backend's 1 s timeout", elapsed)
	}
	if st := stall.Stats(); st.Requests != 1 {
		t.Errorf("stalled backend executions = %d, want 1 (never re-sent)", st.Requests)
	}
	if n := fallback.Stats().Requests; n != 0 {
		t.Errorf("sent to the next backend %d times: a request that may have run must not run elsewhere", n)
	}
	rec := idemStatus(t, gw.URL, key, nil)
	if rec["state"] != "FAILED" || rec["attempts"] != float64(1) {
		t.Errorf("record %v, want FAILED after 1 attempt", rec)
	}
	if a := attempts(resp); a != "1" {
		t.Errorf("Oncegate-Attempts = %q, want 1", a)
	}
	resilienceRow(t, "2a", "stall before first byte (first_byte 200ms, timeout 1s, no key dedup)", "1, never re-sent (fallback: 0)",
		fmt.Sprintf("%d backend_timeout after %v, x-should-retry: %s", resp.Status, elapsed.Round(10*time.Millisecond), resp.Header.Get("x-should-retry")))
}

// Rows 2a and 6, same-key retry: an attempt that was written and ended without an answer may
// have run at the backend (a stall until the timeout, a response lost after completion, a body
// cut off), so a copy of the request must not run it again.
func TestFaultAmbiguousSameKeyRetry(t *testing.T) {
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("ambig", config.TypeMock, "", "oncegate-mock")
	b.FirstByteTimeout, b.Timeout = config.Duration(100*time.Millisecond), config.Duration(300*time.Millisecond)
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"ambig"}}}
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "ambig")

	for _, tc := range []struct{ fault, knobs string }{
		{"stall until the timeout", `{"fault":"stall"}`},
		{"lost response", `{"fault":"lost_response"}`},
		{"non-stream body cut off", `{"fault":"drop_after"}`},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			mock.Reset()
			key := "rs-ambiguous-" + strings.ReplaceAll(tc.fault, " ", "-")
			body := mockBody("row 2/6: a copy of an ambiguous failure: "+tc.fault, tc.knobs, "")
			resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
			rb := resp.Body
			if resp.Status < 500 {
				t.Fatalf("status %d: %s", resp.Status, rb)
			}
			code := assertOpenAIError(t, resp, "")
			resp2 := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
			n := mock.Stats().Requests
			resilienceRow(t, "2/6'", "same-key retry after an ambiguous failure: "+tc.fault, fmt.Sprint(n),
				fmt.Sprintf("first %d %s; retry %d (Oncegate-Idempotency: %s)", resp.Status, code, resp2.Status, resp2.Header.Get("Oncegate-Idempotency")))
			if n != 1 || resp2.Header.Get("Oncegate-Idempotency") != "replayed" {
				t.Fatalf("%s (got %d executions, retry outcome %q)", ambiguousReleasedBug, n, resp2.Header.Get("Oncegate-Idempotency"))
			}
		})
	}
}

const ambiguousReleasedBug = "regression: a failure after the request was written (ErrAmbiguous → 504 backend_timeout; non-stream body cut off → 502 backend_truncated; " +
	"the backend may have run it) is stored FAILED with Retryable: true (workers/execution.go finishFailed sets it for every failure, kv.Result.Ambiguous is only reported), " +
	"so a same-key retry runs it again: a second execution of one intent"

// Row 2b: a backend that deduplicates the forwarded Idempotency-Key: after first_byte_timeout
// the gateway re-sends, the backend joins the running execution and answers it once.
func TestFaultStallHonorsIdempotencyKey(t *testing.T) {
	type run struct {
		done   chan struct{}
		status int
		body   []byte
	}
	var (
		mu      sync.Mutex
		runs    = map[string]*run{}
		wg      sync.WaitGroup
		execute = mockllm.New(mockllm.Options{Models: []string{"oncegate-mock"}})
	)
	const execTime = 300 * time.Millisecond // > first_byte_timeout, < 2 × first_byte_timeout
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte, h hit) bool {
		mu.Lock()
		e, dup := runs[h.key]
		if !dup {
			e = &run{done: make(chan struct{})}
			runs[h.key] = e
			wg.Add(1)
			go func() { // the provider runs it whatever happens to the connection
				defer wg.Done()
				time.Sleep(execTime)
				rec := httptest.NewRecorder()
				execute.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, chatPath, bytes.NewReader(body)))
				e.status, e.body = rec.Code, rec.Body.Bytes()
				close(e.done)
			}()
		}
		mu.Unlock()
		select {
		case <-e.done:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(e.status)
			_, _ = w.Write(e.body)
		case <-r.Context().Done():
		}
		return true
	})
	t.Cleanup(wg.Wait)
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("dedup", config.TypeOpenAI, up.base(), "oncegate-mock")
	b.FirstByteTimeout, b.HonorsIdempotencyKey = config.Duration(200*time.Millisecond), true
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"dedup"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	const msg, key = "row 2: a backend that honours Idempotency-Key", "rs-stall-dedup"
	resp := postChat(t, gw.URL, chatBody("oncegate-mock", msg, ""), map[string]string{"Idempotency-Key": key})
	rb := resp.Body
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.Status, rb)
	}
	if got := parseCompletion(t, rb).Choices[0].Message.Content; got != mockContent(t, msg) {
		t.Errorf("content %q", got)
	}
	hits := up.Hits()
	if n := execute.Stats().Requests; n != 1 {
		t.Errorf("real executions = %d, want 1", n)
	}
	if len(hits) != 2 || attempts(resp) != "2" {
		t.Errorf("%d sends (Oncegate-Attempts %q), want 2: the first timed out before its first byte, the re-send joined it", len(hits), attempts(resp))
	}
	for i, h := range hits {
		if h.key == "" || h.key != hits[0].key || !strings.HasPrefix(h.key, "oncegate-") || strings.Contains(h.key, key) {
			t.Errorf("send %d forwarded Idempotency-Key %q (first %q): want one stable gateway key, never the client's", i, h.key, hits[0].key)
		}
	}
	resilienceRow(t, "2b", "stall before first byte, backend honours Idempotency-Key", fmt.Sprintf("1 real (%d sends, same forwarded key)", len(hits)),
		fmt.Sprintf("%d, Oncegate-Attempts: %s", resp.Status, attempts(resp)))
}

// Row 3: 429 with Retry-After: 1 twice, then OK: three attempts, each at least Retry-After
// after the previous refusal.
func TestFault429ThenOK(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 2 × Retry-After")
	}
	t.Parallel()
	up := startUpstream(t, nil)
	cfg := gatewaykit.Config(t)
	cfg.Backends = append(cfg.Backends, fastRetryBackend("limited", config.TypeOpenAI, up.base(), "oncegate-mock"))
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"limited"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	const msg = "row 3: 429 then OK"
	resp := postChat(t, gw.URL, mockBody(msg, `{"fault":"rate_limit","retry_after":"1","fault_first_n":2}`, ""), map[string]string{"Idempotency-Key": "rs-429"})
	b := resp.Body
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.Status, b)
	}
	if got := parseCompletion(t, b).Choices[0].Message.Content; got != mockContent(t, msg) {
		t.Errorf("content %q", got)
	}
	hits := up.Hits()
	if len(hits) != 3 || attempts(resp) != "3" {
		t.Fatalf("%d attempts (header %q), want 3", len(hits), attempts(resp))
	}
	var gaps []string
	for i := 1; i < len(hits); i++ {
		gap := hits[i].at.Sub(hits[i-1].at)
		gaps = append(gaps, gap.Round(time.Millisecond).String())
		if gap < time.Second {
			t.Errorf("attempt %d came %v after a 429 with Retry-After: 1", i+1, gap)
		}
	}
	if st := up.Mock.Stats(); st.Requests != 3 || st.Faults != 2 || st.Completed != 1 {
		t.Errorf("backend stats %+v", st)
	}
	resilienceRow(t, "3", "429 Retry-After: 1 for the first 2 requests", "3 attempts, 1 completion",
		fmt.Sprintf("%d, Oncegate-Attempts: %s, gaps %s (≥ 1s)", resp.Status, attempts(resp), strings.Join(gaps, ", ")))
}

// Row 4: 5xx bursts are retried; a 500 may have done work and is passed through, not retried;
// a 4xx is the answer: stored and replayed, never retried.
func TestFaultStatusCodes(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")

	t.Run("503 burst", func(t *testing.T) {
		mock.Reset()
		const msg = "row 4: a 503 burst"
		resp := postChat(t, gw.URL, mockBody(msg, `{"fault":"error_503","fault_first_n":2}`, ""), map[string]string{"Idempotency-Key": "rs-503-burst"})
		b := resp.Body
		if resp.Status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.Status, b)
		}
		if got := parseCompletion(t, b).Choices[0].Message.Content; got != mockContent(t, msg) {
			t.Errorf("content %q", got)
		}
		st := mock.Stats()
		if st.Requests != 3 || st.Completed != 1 || attempts(resp) != "3" {
			t.Errorf("stats %+v, Oncegate-Attempts %q: want 3 attempts, 1 completion", st, attempts(resp))
		}
		resilienceRow(t, "4a", "503 for the first 2 requests", "3 attempts, 1 completion", fmt.Sprintf("%d, Oncegate-Attempts: %s", resp.Status, attempts(resp)))
	})

	t.Run("500", func(t *testing.T) {
		mock.Reset()
		body := mockBody("row 4: a 500", `{"fault":"error_500"}`, "")
		_, want := askMock(body)
		resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "rs-500"})
		b := resp.Body
		if resp.Status != http.StatusInternalServerError || !bytes.Equal(b, want) {
			t.Fatalf("got %d %q, want 500 %q passed through", resp.Status, b, want)
		}
		if n := mock.Stats().Requests; n != 1 || attempts(resp) != "1" {
			t.Errorf("%d executions (Oncegate-Attempts %q), want 1: a 500 may have done the work", n, attempts(resp))
		}
		if v := resp.Header.Get("x-should-retry"); v != "false" {
			t.Errorf("x-should-retry = %q, want false", v)
		}
		resilienceRow(t, "4b", "500", "1 (not retried)", fmt.Sprintf("%d, backend body passed through byte for byte, x-should-retry: false", resp.Status))
	})

	for _, code := range []int{400, 401, 403, 404, 422} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			mock.Reset()
			key := fmt.Sprintf("rs-final-%d", code)
			body := mockBody(fmt.Sprintf("row 4: a final %d", code), fmt.Sprintf(`{"fault":"error_%d"}`, code), "")
			_, want := askMock(body)
			resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
			b := resp.Body
			if resp.Status != code || !bytes.Equal(b, want) {
				t.Fatalf("got %d %q, want %d %q", resp.Status, b, code, want)
			}
			if v := resp.Header.Get("x-should-retry"); v != "false" {
				t.Errorf("x-should-retry = %q, want false", v)
			}
			dup := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
			db := dup.Body
			if dup.Status != code || !bytes.Equal(db, b) || dup.Header.Get("Oncegate-Idempotency") != "replayed" {
				t.Errorf("duplicate: %d %s %q, want the stored %d replayed", dup.Status, dup.Header.Get("Oncegate-Idempotency"), db, code)
			}
			if n := mock.Stats().Requests; n != 1 || attempts(resp) != "1" {
				t.Errorf("%d executions (Oncegate-Attempts %q), want 1", n, attempts(resp))
			}
			resilienceRow(t, "4c", fmt.Sprintf("%d", code), "1 (never retried)",
				fmt.Sprintf("%d stored; duplicate: %d %s, same body", code, dup.Status, dup.Header.Get("Oncegate-Idempotency")))
		})
	}
}

// Row 6: the backend completed the work but the response never came back: one execution, an
// error for the client, never re-sent.
func TestFaultLostResponse(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	const key = "rs-lost"
	resp := postChat(t, gw.URL, mockBody("row 6: completed, but the response was lost", `{"fault":"lost_response"}`, ""),
		map[string]string{"Idempotency-Key": key})
	b := resp.Body
	if resp.Status < 500 {
		t.Fatalf("status %d: %s, want a 5xx", resp.Status, b)
	}
	code := assertOpenAIError(t, resp, "")
	if st := mock.Stats(); st.Requests != 1 || st.Completed != 1 || attempts(resp) != "1" {
		t.Errorf("stats %+v (Oncegate-Attempts %q), want 1 completed execution, never re-sent", st, attempts(resp))
	}
	if rec := idemStatus(t, gw.URL, key, nil); rec["state"] != "FAILED" || rec["attempts"] != float64(1) {
		t.Errorf("record %v", rec)
	}
	resilienceRow(t, "6", "completed but the response was lost (non-stream)", "1 (completed at the backend), not re-sent",
		fmt.Sprintf("%d %s, x-should-retry: %s", resp.Status, code, resp.Header.Get("x-should-retry")))
}

// Row 8: a 429 storm (100 %, Retry-After: 2, ~5 s) under 30 distinct intents from 3 clients:
// the retry budget keeps backend attempts ≤ 1.2 × requests, and no intent is retried sooner
// than Retry-After.
func TestFault429Storm(t *testing.T) {
	if testing.Short() {
		t.Skip("a 5 s storm")
	}
	t.Parallel()
	const storm, retryAfter = 5 * time.Second, 2 * time.Second
	var stormStart atomic.Pointer[time.Time]
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte, h hit) bool {
		stormStart.CompareAndSwap(nil, &h.at)
		if h.at.Sub(*stormStart.Load()) < storm {
			refuse(w, http.StatusTooManyRequests, "2")
			return true
		}
		return false
	})
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("stormy", config.TypeOpenAI, up.base(), "oncegate-mock")
	// The breaker (429s count as failures) would open after min_requests and stop every retry;
	// kept closed here so that the retry budget alone is measured.
	b.Breaker.MinRequests = 1000
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"stormy"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	// Three clients, each sending one new intent every 100 ms without waiting for earlier
	// answers (an application with calls in flight), so all 30 arrive during the storm.
	const clients, perClient = 3, 10
	type outcome struct {
		status int
		header http.Header
	}
	outcomes := make(chan outcome, clients*perClient)
	var wg sync.WaitGroup
	for c := range clients {
		for i := range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * 100 * time.Millisecond)
				r := send(http.MethodPost, gw.URL+chatPath, chatBody("oncegate-mock", fmt.Sprintf("row 8: storm intent %d-%d", c, i), ""),
					map[string]string{"Idempotency-Key": fmt.Sprintf("rs-storm-%d-%d", c, i)})
				if r.Err != nil && r.Status == 0 {
					outcomes <- outcome{status: -1}
					return
				}
				outcomes <- outcome{r.Status, r.Header}
			}()
		}
	}
	wg.Wait()
	close(outcomes)

	hits := up.Hits()
	perIntent := map[string][]time.Time{}
	for _, h := range hits {
		perIntent[h.intent] = append(perIntent[h.intent], h.at)
	}
	if len(perIntent) != clients*perClient {
		t.Errorf("%d intents reached the backend, want %d", len(perIntent), clients*perClient)
	}
	ratio := float64(len(hits)) / float64(clients*perClient)
	if ratio > 1.2 {
		t.Errorf("backend attempts / client requests = %d/%d = %.2f, want ≤ 1.2 (retry budget 0.2)", len(hits), clients*perClient, ratio)
	}
	minGap := time.Duration(-1)
	for intent, ts := range perIntent {
		for i := 1; i < len(ts); i++ {
			gap := ts[i].Sub(ts[i-1])
			if gap < retryAfter {
				t.Errorf("%s: retried %v after a 429 with Retry-After: 2", intent, gap)
			}
			if minGap < 0 || gap < minGap {
				minGap = gap
			}
		}
	}
	count := map[int]int{}
	var refused http.Header
	for o := range outcomes {
		count[o.status]++
		if o.status == http.StatusTooManyRequests {
			refused = o.header
		}
	}
	if count[-1] > 0 {
		t.Errorf("%d requests failed at the transport", count[-1])
	}
	if count[http.StatusTooManyRequests] == 0 {
		t.Fatalf("statuses %v: the storm did not reach the clients", count)
	}
	resilienceRow(t, "8", "429 storm: 100% 429 Retry-After: 2 for 5s, 30 intents, 3 clients (breaker kept closed)", fmt.Sprintf("%d attempts / 30 intents = %.2f, min retry gap %v", len(hits), ratio, minGap.Round(time.Millisecond)),
		fmt.Sprintf("statuses %v; a 429: Retry-After %q, x-should-retry %q", count, refused.Get("Retry-After"), refused.Get("x-should-retry")))
}
