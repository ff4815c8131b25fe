package e2e

// The exactly-once invariant end to end: N concurrent copies of one keyed intent → one backend
// execution, and every client holds the identical answer; and the rest of the idempotency
// contract (422 on a reused key, 409 while in progress, opt-out, the auto-key window).
//
// The xo* helpers at the end of this file are shared by exactlyonce, joins, takeover, tenants,
// jobsapi, retry_sdk and storm_bench tests. They never call t.Fatal from a goroutine: request
// helpers return an xoResult carrying the error.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestExactlyOnceConcurrentCopies: 200 concurrent copies of one keyed intent, half of them
// streamed, against the slow mock (16 tokens, 20 ms apart). Exactly one backend execution;
// exactly one "created", the rest "joined" or "replayed"; every non-stream body is the same
// bytes, every stream is the same bytes, and the streamed text equals the non-stream text and
// the backend's own answer.
func TestExactlyOnceConcurrentCopies(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "slowmock")
	c := xoClient(t)
	const n = 200
	const key = "xo-concurrent-copies"
	const msg = "two hundred copies of one intent"
	nsBody := xoChatBody(xoSlowModel, msg, false, "")
	stBody := xoChatBody(xoSlowModel, msg, true, "")
	wantID, wantContent := xoReference(t, xoSlowModel, nsBody)
	before := mock.Stats().Requests

	results := make([]xoResult, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := nsBody
			if i%2 == 1 {
				body = stBody
			}
			<-start
			results[i] = xoPost(c, gw.URL+xoChatPath, body, map[string]string{"Idempotency-Key": key})
		}()
	}
	close(start)
	wg.Wait()

	outcomes := map[string]int{}
	var nsRef, stRef []byte
	jobID := ""
	for i, r := range results {
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("copy %d: status %d err %v body %s", i, r.Status, r.Err, r.Body)
		}
		o := r.Header.Get("Oncegate-Idempotency")
		outcomes[o]++
		if (o == "replayed") != (r.Header.Get("Idempotent-Replayed") == "true") {
			t.Errorf("copy %d: outcome %q with Idempotent-Replayed %q", i, o, r.Header.Get("Idempotent-Replayed"))
		}
		if got := r.Header.Get("Idempotency-Key"); got != key {
			t.Errorf("copy %d: Idempotency-Key echoed %q, want %q", i, got, key)
		}
		if jobID == "" {
			jobID = r.Header.Get("Oncegate-Job-Id")
		}
		if got := r.Header.Get("Oncegate-Job-Id"); got != jobID || got == "" {
			t.Errorf("copy %d: Oncegate-Job-Id %q, want %q for every copy", i, got, jobID)
		}
		if i%2 == 0 {
			if nsRef == nil {
				nsRef = r.Body
			} else if !bytes.Equal(r.Body, nsRef) {
				t.Errorf("copy %d (non-stream, %s): body differs from copy 0:\n got %s\nwant %s", i, o, r.Body, nsRef)
			}
		} else {
			if stRef == nil {
				stRef = r.Body
			} else if !bytes.Equal(r.Body, stRef) {
				t.Errorf("copy %d (stream, %s): stream differs from copy 1:\n got %q\nwant %q", i, o, r.Body, stRef)
			}
		}
	}
	t.Logf("outcomes: %v", outcomes)
	if outcomes["created"] != 1 || outcomes["created"]+outcomes["joined"]+outcomes["replayed"] != n {
		t.Errorf("outcomes %v: want exactly one created and the rest joined or replayed", outcomes)
	}
	if got := mock.Stats().Requests - before; got != 1 {
		t.Fatalf("backend executions = %d, want 1", got)
	}

	id, content, err := xoParseCompletion(nsRef)
	if err != nil {
		t.Fatal(err)
	}
	st, err := xoParseStream(stRef)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Done || st.ErrCode != "" {
		t.Errorf("stream transcript: done=%v error=%q, want a complete stream ending in [DONE]", st.Done, st.ErrCode)
	}
	if content != wantContent || id != wantID {
		t.Errorf("non-stream answer %q (%s), want the backend's %q (%s)", content, id, wantContent, wantID)
	}
	if st.Content != content || st.ID != id {
		t.Errorf("stream transcript %q (%s) differs from the non-stream answer %q (%s)", st.Content, st.ID, content, id)
	}
}

// TestIdempotencyContract: the answers to a copy that is not a plain join, on one gateway with
// max_wait 300 ms.
func TestIdempotencyContract(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.MaxWait = config.Duration(300 * time.Millisecond)
	gw := gatewaykit.StartGateway(t, cfg)
	slow := gw.Mock(t, "slowmock")
	fast := gw.Mock(t, "mock")
	c := xoClient(t)
	keyed := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

	// Same key, another body: 422, and the stored answer is the one of the first body, still
	// replayed byte for byte afterwards. A streamed copy of the first body is the same intent.
	t.Run("same key different body after completion", func(t *testing.T) {
		const key = "xo-reuse-completed"
		a := xoChatBody(config.MockModel, "reuse A", false, "")
		before := fast.Stats().Requests
		first := xoPost(c, gw.URL+xoChatPath, a, keyed(key))
		xoWant(t, first, http.StatusOK, "created")
		for _, b := range []struct{ name, body string }{
			{"other message", xoChatBody(config.MockModel, "reuse B", false, "")},
			{"extra parameter", xoChatBody(config.MockModel, "reuse A", false, `"temperature":0.5`)},
			{"other model", xoChatBody(xoSlowModel, "reuse A", false, "")},
			{"other body streamed", xoChatBody(config.MockModel, "reuse B", true, "")},
		} {
			r := xoPost(c, gw.URL+xoChatPath, b.body, keyed(key))
			xoWantError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
			if got := r.Header.Get("x-should-retry"); got != "false" {
				t.Errorf("%s: x-should-retry = %q, want false", b.name, got)
			}
		}
		again := xoPost(c, gw.URL+xoChatPath, a, keyed(key))
		xoWant(t, again, http.StatusOK, "replayed")
		if !bytes.Equal(again.Body, first.Body) {
			t.Errorf("replay after the 422s differs from the original:\n got %s\nwant %s", again.Body, first.Body)
		}
		stream := xoPost(c, gw.URL+xoChatPath, xoChatBody(config.MockModel, "reuse A", true, ""), keyed(key))
		xoWant(t, stream, http.StatusOK, "replayed")
		_, content, _ := xoParseCompletion(first.Body)
		if st, err := xoParseStream(stream.Body); err != nil || st.Content != content || !st.Done {
			t.Errorf("streamed replay %+v (%v), want %q and [DONE]", st, err, content)
		}
		rec := xoIdem(t, c, gw.URL, key, nil)
		if rec["state"] != "COMPLETED" || rec["epoch"] != 1.0 || rec["job_id"] != first.Header.Get("Oncegate-Job-Id") {
			t.Errorf("record after the 422s: %v", rec)
		}
		if got := fast.Stats().Requests - before; got != 1 {
			t.Errorf("backend executions = %d, want 1", got)
		}
	})

	t.Run("same key different body while pending", func(t *testing.T) {
		const key = "xo-reuse-pending"
		a := xoChatBody(xoSlowModel, "reuse pending A", false, `"mock":{"inter_token_ms":50}`)
		_, wantContent := xoReference(t, xoSlowModel, a)
		before := slow.Stats().Requests
		firstc := xoGo(func() xoResult { return xoPost(c, gw.URL+xoChatPath, a, keyed(key)) })
		testkit.CheckFor(t, 10*time.Second, pollEvery, inFlight(slow, 1))
		r := xoPost(c, gw.URL+xoChatPath, xoChatBody(xoSlowModel, "reuse pending B", false, `"mock":{"inter_token_ms":50}`), keyed(key))
		xoWantError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
		first := <-firstc
		xoWant(t, first, http.StatusOK, "created")
		if _, content, err := xoParseCompletion(first.Body); err != nil || content != wantContent {
			t.Errorf("the original's answer %q (%v), want %q: a 422 must not touch it", content, err, wantContent)
		}
		again := xoPost(c, gw.URL+xoChatPath, a, keyed(key))
		xoWant(t, again, http.StatusOK, "replayed")
		if !bytes.Equal(again.Body, first.Body) {
			t.Errorf("replay differs from the original:\n got %s\nwant %s", again.Body, first.Body)
		}
		if got := slow.Stats().Requests - before; got != 1 {
			t.Errorf("backend executions = %d, want 1", got)
		}
	})

	// PENDING: a non-stream copy waits max_wait (300 ms) then gets a retryable 409 that the
	// official SDKs retry (x-should-retry: true, Retry-After); a stream copy attaches and gets
	// the whole stream.
	t.Run("in progress", func(t *testing.T) {
		const key = "xo-in-progress"
		a := xoChatBody(xoSlowModel, "long running", false, `"mock":{"inter_token_ms":100}`) // ≈1.6 s
		_, wantContent := xoReference(t, xoSlowModel, a)
		before := slow.Stats().Requests
		firstc := xoGo(func() xoResult { return xoPost(c, gw.URL+xoChatPath, a, keyed(key)) })
		testkit.CheckFor(t, 10*time.Second, pollEvery, inFlight(slow, 1))

		t0 := time.Now()
		dup := xoPost(c, gw.URL+xoChatPath, a, keyed(key))
		waited := time.Since(t0)
		xoWantError(t, dup, http.StatusConflict, "idempotency_key_in_use")
		for h, want := range map[string]string{"Retry-After": "1", "retry-after-ms": "1000", "x-should-retry": "true",
			"Oncegate-Idempotency": "joined", "Idempotency-Key": key} {
			if got := dup.Header.Get(h); got != want {
				t.Errorf("409: %s = %q, want %q", h, got, want)
			}
		}
		if waited < 250*time.Millisecond {
			t.Errorf("409 after %v: a non-stream copy must wait max_wait (300ms) first", waited)
		}

		stream := xoPost(c, gw.URL+xoChatPath, xoChatBody(xoSlowModel, "long running", true, `"mock":{"inter_token_ms":100}`), keyed(key))
		xoWant(t, stream, http.StatusOK, "joined")
		if st, err := xoParseStream(stream.Body); err != nil || st.Content != wantContent || !st.Done {
			t.Errorf("attached stream %+v (%v), want %q then [DONE]", st, err, wantContent)
		}
		first := <-firstc
		xoWant(t, first, http.StatusOK, "created")
		if _, content, _ := xoParseCompletion(first.Body); content != wantContent {
			t.Errorf("original answer %q, want %q", content, wantContent)
		}
		after := xoPost(c, gw.URL+xoChatPath, a, keyed(key))
		xoWant(t, after, http.StatusOK, "replayed")
		if !bytes.Equal(after.Body, first.Body) {
			t.Errorf("replay differs from the original")
		}
		if got := slow.Stats().Requests - before; got != 1 {
			t.Errorf("backend executions = %d, want 1", got)
		}
	})

	// X-Allow-Duplicate: true executes every copy, keyed or not, and leaves the key unclaimed.
	t.Run("allow duplicate", func(t *testing.T) {
		const key = "xo-allow-duplicate"
		a := xoChatBody(config.MockModel, "duplicates allowed", false, "")
		_, wantContent := xoReference(t, config.MockModel, a)
		for _, tc := range []struct {
			name string
			hdr  map[string]string
		}{
			{"keyed", map[string]string{"Idempotency-Key": key, "X-Allow-Duplicate": "true"}},
			{"keyless", map[string]string{"X-Allow-Duplicate": "true"}},
		} {
			before := fast.Stats().Requests
			r1 := xoPost(c, gw.URL+xoChatPath, a, tc.hdr)
			r2 := xoPost(c, gw.URL+xoChatPath, a, tc.hdr)
			for _, r := range []xoResult{r1, r2} {
				xoWant(t, r, http.StatusOK, "bypassed")
				if _, content, _ := xoParseCompletion(r.Body); content != wantContent {
					t.Errorf("%s: answer %q, want %q", tc.name, content, wantContent)
				}
			}
			if r1.Header.Get("Oncegate-Job-Id") == r2.Header.Get("Oncegate-Job-Id") {
				t.Errorf("%s: both bypassed copies report job %s", tc.name, r1.Header.Get("Oncegate-Job-Id"))
			}
			if got := fast.Stats().Requests - before; got != 2 {
				t.Errorf("%s: backend executions = %d, want 2", tc.name, got)
			}
		}
		// The key was never claimed by the bypassed requests.
		r := xoPost(c, gw.URL+xoChatPath, a, keyed(key))
		xoWant(t, r, http.StatusOK, "created")
	})
}

// TestAutoKey: without a key, identical requests arriving together are one intent; after the
// auto window (here 1 ms) an identical request is a new intent unless it declares itself a
// retry (x-stainless-retry-count >= 1), which matches for the whole TTL. An explicit key is
// never windowed.
func TestAutoKey(t *testing.T) {
	t.Run("identical keyless requests together", func(t *testing.T) {
		gw := gatewaykit.StartGateway(t, nil) // auto_window 3 s
		slow := gw.Mock(t, "slowmock")
		c := xoClient(t)
		body := xoChatBody(xoSlowModel, "keyless together", false, "")
		_, wantContent := xoReference(t, xoSlowModel, body)
		const n = 8
		results := make([]xoResult, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i] = xoPost(c, gw.URL+xoChatPath, body, nil)
			}()
		}
		close(start)
		wg.Wait()
		outcomes := map[string]int{}
		for i, r := range results {
			if r.Err != nil || r.Status != http.StatusOK {
				t.Fatalf("copy %d: %d %v %s", i, r.Status, r.Err, r.Body)
			}
			outcomes[r.Header.Get("Oncegate-Idempotency")]++
			if k := r.Header.Get("Idempotency-Key"); !strings.HasPrefix(k, "auto-") || k != results[0].Header.Get("Idempotency-Key") {
				t.Errorf("copy %d: generated key %q, want one auto- key for all", i, k)
			}
			if !bytes.Equal(r.Body, results[0].Body) {
				t.Errorf("copy %d: body differs", i)
			}
		}
		if _, content, _ := xoParseCompletion(results[0].Body); content != wantContent {
			t.Errorf("answer %q, want %q", content, wantContent)
		}
		if outcomes["created"] != 1 {
			t.Errorf("outcomes %v, want exactly one created", outcomes)
		}
		if got := slow.Stats().Requests; got != 1 {
			t.Errorf("backend executions = %d, want 1", got)
		}
	})

	cfg := gatewaykit.Config(t)
	cfg.Idempotency.AutoWindow = config.Duration(time.Millisecond)
	gw := gatewaykit.StartGateway(t, cfg)
	fast := gw.Mock(t, "mock")
	c := xoClient(t)
	for i, tc := range []struct {
		name        string
		first       map[string]string
		second      map[string]string
		wantExec    int64
		wantOutcome string
	}{
		{name: "keyless, no retry header", wantExec: 2, wantOutcome: "created"},
		{name: "keyless, retry count 0", second: map[string]string{"x-stainless-retry-count": "0"}, wantExec: 2, wantOutcome: "created"},
		{name: "keyless, retry count 1", second: map[string]string{"x-stainless-retry-count": "1"}, wantExec: 1, wantOutcome: "replayed"},
		{name: "keyless, retry count 2", second: map[string]string{"x-stainless-retry-count": "2"}, wantExec: 1, wantOutcome: "replayed"},
		{name: "keyless, retry count not a number", second: map[string]string{"x-stainless-retry-count": "yes"}, wantExec: 2, wantOutcome: "created"},
		{name: "explicit key is not windowed", first: map[string]string{"Idempotency-Key": "xo-window"},
			second: map[string]string{"Idempotency-Key": "xo-window"}, wantExec: 1, wantOutcome: "replayed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := xoChatBody(config.MockModel, fmt.Sprintf("sequential %d", i), false, "")
			before := fast.Stats().Requests
			r1 := xoPost(c, gw.URL+xoChatPath, body, tc.first)
			xoWant(t, r1, http.StatusOK, "created")
			// The window is 1 ms: wait it out on the record's own clock, not with a sleep.
			created := time.Now()
			testkit.CheckFor(t, time.Second, pollEvery, func() error {
				if d := time.Since(created); d <= 5*time.Millisecond {
					return fmt.Errorf("only %v since the first answer, the window is not over", d)
				}
				return nil
			})
			r2 := xoPost(c, gw.URL+xoChatPath, body, tc.second)
			xoWant(t, r2, http.StatusOK, tc.wantOutcome)
			if tc.wantOutcome == "replayed" && !bytes.Equal(r2.Body, r1.Body) {
				t.Errorf("replay differs from the first answer:\n got %q\nwant %q", xoTail(r2.Body), xoTail(r1.Body))
			}
			if got := fast.Stats().Requests - before; got != tc.wantExec {
				t.Errorf("backend executions = %d, want %d", got, tc.wantExec)
			}
		})
	}
}

// TestReplayByteIdentical: a completed non-stream answer is replayed byte for byte (the mock
// ends its body with "\n"; a stored body that was re-encoded as JSON would lose it), and a
// completed stream is replayed as the same frames then [DONE]. The first replay reads the
// record; later ones come from the API node's replay cache (when on), which must answer the
// same bytes and still refuse the key with another body.
func TestReplayByteIdentical(t *testing.T) {
	for _, cacheBytes := range []int64{0, 32 << 20} {
		t.Run(fmt.Sprintf("replay_cache_bytes=%d", cacheBytes), func(t *testing.T) {
			cfg := gatewaykit.Config(t)
			cfg.Idempotency.ReplayCacheBytes = cacheBytes
			gw := gatewaykit.StartGateway(t, cfg)
			c := xoClient(t)
			mock := gw.Mock(t, config.MockBackendName)
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
					key := fmt.Sprintf("xo-byte-identical-%v", stream)
					body := xoChatBody(config.MockModel, "byte identical", stream, "")
					before := mock.Stats().Requests
					first := xoPost(c, gw.URL+xoChatPath, body, map[string]string{"Idempotency-Key": key})
					xoWant(t, first, http.StatusOK, "created")
					for i := 0; i < 3; i++ {
						again := xoPost(c, gw.URL+xoChatPath, body, map[string]string{"Idempotency-Key": key})
						xoWant(t, again, http.StatusOK, "replayed")
						if !bytes.Equal(first.Body, again.Body) {
							t.Fatalf("replay %d differs from the first answer:\n got %q\nwant %q", i, again.Body, first.Body)
						}
					}
					other := xoPost(c, gw.URL+xoChatPath, xoChatBody(config.MockModel, "another body", stream, ""), map[string]string{"Idempotency-Key": key})
					xoWantError(t, other, http.StatusUnprocessableEntity, "idempotency_key_reused")
					if n := mock.Stats().Requests - before; n != 1 {
						t.Fatalf("%d backend executions for one key, want 1", n)
					}
				})
			}
		})
	}
}

// xoCompactEqual reports whether a and b are the same JSON text once compacted.
func xoCompactEqual(a, b []byte) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// ---- shared helpers ----

const (
	xoChatPath  = "/v1/chat/completions"
	xoSlowModel = "oncegate-mock-slow"
)

// xoClient is an HTTP client for one test; its idle connections are closed when the test ends
// (before the gateway stops), so no transport goroutine outlives the test.
func xoClient(t testing.TB) *http.Client {
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// xoResult is one finished HTTP exchange.
type xoResult struct {
	Status     int
	Header     http.Header
	Body       []byte
	Err        error
	Start, End time.Time
}

// xoDo sends one request and reads the whole response. Safe to call from any goroutine.
func xoDo(c *http.Client, method, url, body string, hdr map[string]string) xoResult {
	r := xoResult{Start: time.Now()}
	defer func() { r.End = time.Now() }()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		r.Err = err
		return r
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		r.Err = err
		return r
	}
	defer resp.Body.Close()
	r.Status, r.Header = resp.StatusCode, resp.Header
	r.Body, r.Err = io.ReadAll(resp.Body)
	r.End = time.Now()
	return r
}

func xoPost(c *http.Client, url, body string, hdr map[string]string) xoResult {
	return xoDo(c, http.MethodPost, url, body, hdr)
}

// xoGo runs f in a goroutine; the channel delivers its result.
func xoGo(f func() xoResult) <-chan xoResult {
	ch := make(chan xoResult, 1)
	go func() { ch <- f() }()
	return ch
}

// xoChatBody is a chat completion request with one user message; extra is raw JSON members.
func xoChatBody(model, msg string, stream bool, extra string) string {
	m, _ := json.Marshal(msg)
	b := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(m) + `}]`
	if stream {
		b += `,"stream":true`
	}
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// xoWant checks status and the Oncegate-Idempotency outcome.
func xoWant(t testing.TB, r xoResult, status int, outcome string) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("request failed: %v", r.Err)
	}
	if r.Status != status {
		t.Fatalf("status %d, want %d; body %s", r.Status, status, r.Body)
	}
	if got := r.Header.Get("Oncegate-Idempotency"); got != outcome {
		t.Errorf("Oncegate-Idempotency = %q, want %q", got, outcome)
	}
}

// xoWantError checks an OpenAI error response with code.
func xoWantError(t testing.TB, r xoResult, status int, code string) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("request failed: %v", r.Err)
	}
	if r.Status != status {
		t.Fatalf("status %d, want %d; body %s", r.Status, status, r.Body)
	}
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || (code != "" && e.Error.Code != code) || e.Error.Message == "" {
		t.Errorf("error body %s, want an OpenAI error with code %q", r.Body, code)
	}
}

// xoReference is the backend's own answer (id, content) to body for model: a fresh mock with
// the gateway's defaults (16 tokens), asked directly with no delay.
func xoReference(t testing.TB, model, body string) (id, content string) {
	t.Helper()
	b, err := backend.PrepareBody([]byte(body), false)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, xoChatPath, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Mock-TTFT-Ms", "0")
	req.Header.Set("X-Mock-Inter-Token-Ms", "0")
	mockllm.New(mockllm.Options{Models: []string{model}, Tokens: config.DefaultMockTokens}).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("reference: %d %s", rec.Code, rec.Body.Bytes())
	}
	id, content, err = xoParseCompletion(rec.Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return id, content
}

// xoParseCompletion reads id and content of a one-choice chat.completion.
func xoParseCompletion(b []byte) (id, content string, err error) {
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Object != "chat.completion" || len(c.Choices) != 1 {
		return "", "", fmt.Errorf("not a one-choice chat.completion (%v): %s", err, b)
	}
	return c.ID, c.Choices[0].Message.Content, nil
}

// xoEvent is one SSE event.
type xoEvent struct {
	ID    string
	HasID bool
	Data  string
}

// xoSSE splits an SSE body into events ("id:" and "data:" lines; comments skipped). Anything
// else, or a body not ending with a blank line, is an error.
func xoSSE(body []byte) ([]xoEvent, error) {
	if len(body) == 0 {
		return nil, nil
	}
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		return nil, fmt.Errorf("SSE body does not end with a blank line: %q", xoTail(body))
	}
	var out []xoEvent
	for _, block := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		var ev xoEvent
		data := false
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, ":"):
			case strings.HasPrefix(line, "id: "):
				ev.ID, ev.HasID = strings.TrimPrefix(line, "id: "), true
			case strings.HasPrefix(line, "data: ") && !data:
				ev.Data, data = strings.TrimPrefix(line, "data: "), true
			default:
				return nil, fmt.Errorf("malformed SSE line %q in %q", line, block)
			}
		}
		if data {
			out = append(out, ev)
		} else if ev.HasID {
			return nil, fmt.Errorf("SSE event with an id and no data: %q", block)
		}
	}
	return out, nil
}

// xoStream is a parsed chat completion stream.
type xoStream struct {
	Data    []string // data payloads in order
	ID      string
	Content string
	Done    bool   // ended with [DONE]
	ErrCode string // the code of an error event that ended it
}

// xoParseStream parses a chat completion SSE body: chunks, then [DONE] or an error event last.
func xoParseStream(body []byte) (xoStream, error) {
	var s xoStream
	evs, err := xoSSE(body)
	if err != nil {
		return s, err
	}
	for i, ev := range evs {
		s.Data = append(s.Data, ev.Data)
		last := i == len(evs)-1
		if ev.Data == "[DONE]" {
			if !last {
				return s, errors.New("[DONE] is not the last event")
			}
			s.Done = true
			continue
		}
		var ch struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &ch); err != nil {
			return s, fmt.Errorf("event %d is not JSON: %v: %s", i, err, ev.Data)
		}
		if ch.Error != nil {
			if !last {
				return s, fmt.Errorf("error event %d is not the last", i)
			}
			s.ErrCode = ch.Error.Code
			continue
		}
		if ch.Object != "chat.completion.chunk" {
			return s, fmt.Errorf("event %d is not a chat.completion.chunk: %s", i, ev.Data)
		}
		if s.ID == "" {
			s.ID = ch.ID
		}
		for _, c := range ch.Choices {
			s.Content += c.Delta.Content
		}
	}
	return s, nil
}

func xoTail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}

// xoSSEReader reads a live SSE response one event at a time, keeping every byte read.
type xoSSEReader struct {
	br  *bufio.Reader
	raw bytes.Buffer
}

func xoNewSSEReader(r io.Reader) *xoSSEReader { return &xoSSEReader{br: bufio.NewReader(r)} }

// next returns the next event block, including its terminating blank line.
func (r *xoSSEReader) next() ([]byte, error) {
	var ev []byte
	for {
		line, err := r.br.ReadBytes('\n')
		ev = append(ev, line...)
		r.raw.Write(line)
		if err != nil {
			return ev, err
		}
		if len(line) == 1 && len(ev) > 1 {
			return ev, nil
		}
	}
}

// xoOpen starts a request and returns the live response (the caller closes its body).
func xoOpen(c *http.Client, method, url, body string, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return c.Do(req)
}

// xoIdem is GET /v1/idempotency/{key} as a JSON object (it fails the test on anything but 200).
func xoIdem(t testing.TB, c *http.Client, base, key string, hdr map[string]string) map[string]any {
	t.Helper()
	r := xoDo(c, http.MethodGet, base+"/v1/idempotency/"+url.PathEscape(key), "", hdr)
	if r.Err != nil || r.Status != http.StatusOK {
		t.Fatalf("GET idempotency %q: %d %v %s", key, r.Status, r.Err, r.Body)
	}
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("idempotency status is not JSON: %s", r.Body)
	}
	return m
}

// xoAutoKey is the key the gateway derives for a keyless POST of body to path by tenant:
// "auto-" + hex(SHA-256(tenant \0 "auto" \0 method \0 path \0 fingerprint \0)[:16]), the
// fingerprint being the SHA-256 of the body's canonical JSON without stream/stream_options
// (httpapi/keys.go). Tests check it against the key the gateway echoes before relying on it.
func xoAutoKey(tenant, path string, body []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return "", err
	}
	delete(obj, "stream")
	delete(obj, "stream_options")
	canon, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	fp := sha256.Sum256(canon)
	h := sha256.New()
	for _, p := range []string{tenant, "auto", http.MethodPost, path, hex.EncodeToString(fp[:])} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "auto-" + hex.EncodeToString(h.Sum(nil)[:16]), nil
}
