package e2e

// The exactly-once invariant end to end: N concurrent copies of one keyed intent → one backend
// execution, and every client holds the identical answer; and the rest of the idempotency
// contract (422 on a reused key, 409 while in progress, opt-out, the auto-key window).

import (
	"bytes"
	"errors"
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

// TestExactlyOnceConcurrentCopies: 200 concurrent copies of one keyed intent, half of them
// streamed, against the slow mock (16 tokens, 20 ms apart). Exactly one backend execution;
// exactly one "created", the rest "joined" or "replayed"; every non-stream body is the same
// bytes, every stream is the same bytes, and the streamed text equals the non-stream text and
// the backend's own answer.
func TestExactlyOnceConcurrentCopies(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "slowmock")
	const n = 200
	const key = "xo-concurrent-copies"
	const msg = "two hundred copies of one intent"
	nsBody := chatBody(slowModel, msg, "")
	stBody := chatBody(slowModel, msg, `"stream":true`)
	wantID, wantContent := reference(t, nsBody)
	before := mock.Stats().Requests

	results := make([]result, n)
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
			results[i] = send(http.MethodPost, gw.URL+chatPath, body, map[string]string{"Idempotency-Key": key})
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

	id, content, err := answerOf(nsRef)
	if err != nil {
		t.Fatal(err)
	}
	st, err := parseChatStream(stRef)
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
	keyed := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

	// Same key, another body: 422, and the stored answer is the one of the first body, still
	// replayed byte for byte afterwards. A streamed copy of the first body is the same intent.
	t.Run("same key different body after completion", func(t *testing.T) {
		const key = "xo-reuse-completed"
		a := chatBody(config.MockModel, "reuse A", "")
		before := fast.Stats().Requests
		first := postChat(t, gw.URL, a, keyed(key))
		expect(t, first, http.StatusOK, "created")
		for _, b := range []struct{ name, body string }{
			{"other message", chatBody(config.MockModel, "reuse B", "")},
			{"extra parameter", chatBody(config.MockModel, "reuse A", `"temperature":0.5`)},
			{"other model", chatBody(slowModel, "reuse A", "")},
			{"other body streamed", chatBody(config.MockModel, "reuse B", `"stream":true`)},
		} {
			r := postChat(t, gw.URL, b.body, keyed(key))
			expectError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
			if got := r.Header.Get("x-should-retry"); got != "false" {
				t.Errorf("%s: x-should-retry = %q, want false", b.name, got)
			}
		}
		again := postChat(t, gw.URL, a, keyed(key))
		expect(t, again, http.StatusOK, "replayed")
		if !bytes.Equal(again.Body, first.Body) {
			t.Errorf("replay after the 422s differs from the original:\n got %s\nwant %s", again.Body, first.Body)
		}
		stream := postChat(t, gw.URL, chatBody(config.MockModel, "reuse A", `"stream":true`), keyed(key))
		expect(t, stream, http.StatusOK, "replayed")
		_, content, _ := answerOf(first.Body)
		if st, err := parseChatStream(stream.Body); err != nil || st.Content != content || !st.Done {
			t.Errorf("streamed replay %+v (%v), want %q and [DONE]", st, err, content)
		}
		rec := idemStatus(t, gw.URL, key, nil)
		if rec["state"] != "COMPLETED" || rec["epoch"] != 1.0 || rec["job_id"] != first.Header.Get("Oncegate-Job-Id") {
			t.Errorf("record after the 422s: %v", rec)
		}
		if got := fast.Stats().Requests - before; got != 1 {
			t.Errorf("backend executions = %d, want 1", got)
		}
	})

	t.Run("same key different body while pending", func(t *testing.T) {
		const key = "xo-reuse-pending"
		a := chatBody(slowModel, "reuse pending A", `"mock":{"inter_token_ms":50}`)
		_, wantContent := reference(t, a)
		before := slow.Stats().Requests
		firstc := async(func() result { return send(http.MethodPost, gw.URL+chatPath, a, keyed(key)) })
		testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
			if slow.Stats().InFlight == 0 {
				return errors.New("the first request has not reached the backend")
			}
			return nil
		})
		r := postChat(t, gw.URL, chatBody(slowModel, "reuse pending B", `"mock":{"inter_token_ms":50}`), keyed(key))
		expectError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
		first := <-firstc
		expect(t, first, http.StatusOK, "created")
		if _, content, err := answerOf(first.Body); err != nil || content != wantContent {
			t.Errorf("the original's answer %q (%v), want %q: a 422 must not touch it", content, err, wantContent)
		}
		again := postChat(t, gw.URL, a, keyed(key))
		expect(t, again, http.StatusOK, "replayed")
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
		a := chatBody(slowModel, "long running", `"mock":{"inter_token_ms":100}`) // ≈1.6 s
		_, wantContent := reference(t, a)
		before := slow.Stats().Requests
		firstc := async(func() result { return send(http.MethodPost, gw.URL+chatPath, a, keyed(key)) })
		testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
			if slow.Stats().InFlight == 0 {
				return errors.New("the first request has not reached the backend")
			}
			return nil
		})

		t0 := time.Now()
		dup := postChat(t, gw.URL, a, keyed(key))
		waited := time.Since(t0)
		expectError(t, dup, http.StatusConflict, "idempotency_key_in_use")
		for h, want := range map[string]string{"Retry-After": "1", "retry-after-ms": "1000", "x-should-retry": "true",
			"Oncegate-Idempotency": "joined", "Idempotency-Key": key} {
			if got := dup.Header.Get(h); got != want {
				t.Errorf("409: %s = %q, want %q", h, got, want)
			}
		}
		if waited < 250*time.Millisecond {
			t.Errorf("409 after %v: a non-stream copy must wait max_wait (300ms) first", waited)
		}

		stream := postChat(t, gw.URL, chatBody(slowModel, "long running", `"stream":true,"mock":{"inter_token_ms":100}`), keyed(key))
		expect(t, stream, http.StatusOK, "joined")
		if st, err := parseChatStream(stream.Body); err != nil || st.Content != wantContent || !st.Done {
			t.Errorf("attached stream %+v (%v), want %q then [DONE]", st, err, wantContent)
		}
		first := <-firstc
		expect(t, first, http.StatusOK, "created")
		if _, content, _ := answerOf(first.Body); content != wantContent {
			t.Errorf("original answer %q, want %q", content, wantContent)
		}
		after := postChat(t, gw.URL, a, keyed(key))
		expect(t, after, http.StatusOK, "replayed")
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
		a := chatBody(config.MockModel, "duplicates allowed", "")
		_, wantContent := reference(t, a)
		for _, tc := range []struct {
			name string
			hdr  map[string]string
		}{
			{"keyed", map[string]string{"Idempotency-Key": key, "X-Allow-Duplicate": "true"}},
			{"keyless", map[string]string{"X-Allow-Duplicate": "true"}},
		} {
			before := fast.Stats().Requests
			r1 := postChat(t, gw.URL, a, tc.hdr)
			r2 := postChat(t, gw.URL, a, tc.hdr)
			for _, r := range []result{r1, r2} {
				expect(t, r, http.StatusOK, "bypassed")
				if _, content, _ := answerOf(r.Body); content != wantContent {
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
		r := postChat(t, gw.URL, a, keyed(key))
		expect(t, r, http.StatusOK, "created")
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
		body := chatBody(slowModel, "keyless together", "")
		_, wantContent := reference(t, body)
		const n = 8
		results := make([]result, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i] = send(http.MethodPost, gw.URL+chatPath, body, nil)
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
		if _, content, _ := answerOf(results[0].Body); content != wantContent {
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
			body := chatBody(config.MockModel, fmt.Sprintf("sequential %d", i), "")
			before := fast.Stats().Requests
			r1 := postChat(t, gw.URL, body, tc.first)
			expect(t, r1, http.StatusOK, "created")
			// The window is 1 ms: wait it out on the record's own clock, not with a sleep.
			created := time.Now()
			testkit.CheckFor(t, time.Second, pollEvery, func() error {
				if d := time.Since(created); d <= 5*time.Millisecond {
					return fmt.Errorf("only %v since the first answer, the window is not over", d)
				}
				return nil
			})
			r2 := postChat(t, gw.URL, body, tc.second)
			expect(t, r2, http.StatusOK, tc.wantOutcome)
			if tc.wantOutcome == "replayed" && !bytes.Equal(r2.Body, r1.Body) {
				t.Errorf("replay differs from the first answer:\n got %q\nwant %q", tail(r2.Body), tail(r1.Body))
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
			mock := gw.Mock(t, config.MockBackendName)
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
					key := fmt.Sprintf("xo-byte-identical-%v", stream)
					body := chatBody(config.MockModel, "byte identical", streamed(stream))
					before := mock.Stats().Requests
					first := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
					expect(t, first, http.StatusOK, "created")
					for i := 0; i < 3; i++ {
						again := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
						expect(t, again, http.StatusOK, "replayed")
						if !bytes.Equal(first.Body, again.Body) {
							t.Fatalf("replay %d differs from the first answer:\n got %q\nwant %q", i, again.Body, first.Body)
						}
					}
					other := postChat(t, gw.URL, chatBody(config.MockModel, "another body", streamed(stream)), map[string]string{"Idempotency-Key": key})
					expectError(t, other, http.StatusUnprocessableEntity, "idempotency_key_reused")
					if n := mock.Stats().Requests - before; n != 1 {
						t.Fatalf("%d backend executions for one key, want 1", n)
					}
				})
			}
		})
	}
}
