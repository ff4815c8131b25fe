package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// slowBody is a chat request for a ~2 s generation of the slow mock (50 tokens, 40 ms apart).
func slowBody(msg string, stream bool) string {
	return chatBody(slowModel, msg, fmt.Sprintf(`"stream":%v,"mock":{"tokens":50,"inter_token_ms":40}`, stream))
}

// expectShed checks r is the admission's refusal: 503, Retry-After, x-should-retry: true and
// an OpenAI error body with code overloaded.
func expectShed(t *testing.T, r result) {
	t.Helper()
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", r.Status, r.Body)
	}
	if r.Header.Get("Retry-After") == "" || r.Header.Get("x-should-retry") != "true" {
		t.Errorf("a shed request says Retry-After %q, x-should-retry %q; want a Retry-After and true",
			r.Header.Get("Retry-After"), r.Header.Get("x-should-retry"))
	}
	assertOpenAIError(t, r, "overloaded")
}

// openLive starts a slow stream with key and waits for its first event, so its execution is
// admitted and running when it returns. The stream is read to its end in the background.
func openLive(t *testing.T, url, key, msg string) <-chan error {
	t.Helper()
	resp, err := openStream(http.MethodPost, url+chatPath, slowBody(msg, true), map[string]string{"Idempotency-Key": key})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("stream %s: status %d", key, resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		resp.Body.Close()
		t.Fatalf("stream %s: %v", key, err)
	}
	done := make(chan error, 1)
	go func() {
		defer resp.Body.Close()
		_, err := br.WriteTo(discard{})
		done <- err
	}()
	return done
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestShedsNewIntentsAtCapacity (issue 17, bounded admission): with admission.max_executions
// 4, a burst of 24 new intents gets its excess answered 503 with Retry-After at once, and
// none of those reaches a backend, while the admitted ones all finish; then, with the node
// full, a flood of copies of a running intent is served entirely (a copy costs no backend
// call, so it is never shed), and a new intent is still refused.
func TestShedsNewIntentsAtCapacity(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Admission = config.Admission{MaxExecutions: 4}
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "slowmock")

	const burst = 24
	before := mock.Stats().Requests
	results := make([]result, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			results[i] = send(http.MethodPost, gw.URL+chatPath, slowBody(fmt.Sprintf("shed burst %d", i), false), nil)
		})
	}
	wg.Wait()
	ok, shed := 0, 0
	for _, r := range results {
		switch {
		case r.Err != nil:
			t.Fatalf("request failed: %v", r.Err)
		case r.Status == http.StatusOK:
			ok++
		default:
			expectShed(t, r)
			shed++
		}
	}
	t.Logf("burst of %d new intents: %d answered, %d shed", burst, ok, shed)
	if ok < 4 || shed == 0 {
		t.Fatalf("%d answered and %d shed; want at least the 4 admitted answered and the excess shed", ok, shed)
	}
	if got := mock.Stats().Requests - before; got != int64(ok) {
		t.Fatalf("the backend ran %d executions for %d answers: shed requests must never reach it", got, ok)
	}

	// Fill the node with four live executions, one of them the flood's intent.
	var live []<-chan error
	for i := range 4 {
		live = append(live, openLive(t, gw.URL, fmt.Sprintf("shed-live-%d", i), fmt.Sprintf("shed live %d", i)))
	}
	expectShed(t, send(http.MethodPost, gw.URL+chatPath, slowBody("shed one more", false), nil))
	const copies = 24
	flood := make([]result, copies)
	for i := range copies {
		wg.Go(func() {
			flood[i] = send(http.MethodPost, gw.URL+chatPath, slowBody("shed live 0", true), map[string]string{"Idempotency-Key": "shed-live-0"})
		})
	}
	wg.Wait()
	for i, r := range flood {
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("copy %d of a running intent on a full node: status %d, err %v: %s", i, r.Status, r.Err, r.Body)
		}
		if o := r.Header.Get("Oncegate-Idempotency"); o != "joined" && o != "replayed" {
			t.Fatalf("copy %d answered %q, want joined or replayed", i, o)
		}
	}
	for _, done := range live {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a live stream broke: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a live stream did not end")
		}
	}
	if got := mock.Stats().Requests - before; got != int64(ok)+4 {
		t.Fatalf("the backend ran %d executions, want %d (the burst's answers and the 4 live ones)", got, ok+4)
	}
	// Room again once they ended.
	if r := send(http.MethodPost, gw.URL+chatPath, chatBody(slowModel, "shed after", ""), nil); r.Status != http.StatusOK {
		t.Fatalf("a new intent after the load: status %d: %s", r.Status, r.Body)
	}
}

// TestShedsWhileTheJobQueueWaits (issue 17): with one worker slot and admission.max_queue_wait
// 300 ms, new intents queue behind a slow one until the head of JOBS has waited longer than
// the bound; from then on a new intent is answered 503 at once, a copy of a queued intent is
// still admitted (and answered once its turn comes), and once the queue drained new intents
// are admitted again.
func TestShedsWhileTheJobQueueWaits(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Workers.Concurrency = 1
	cfg.Admission = config.Admission{MaxQueueWait: config.Duration(300 * time.Millisecond)}
	gw := gatewaykit.StartGateway(t, cfg)

	first := openLive(t, gw.URL, "queue-first", "queue first") // takes the only slot for ~2 s
	queued := async(func() result {
		return send(http.MethodPost, gw.URL+chatPath, slowBody("queue second", false), map[string]string{"Idempotency-Key": "queue-second"})
	})
	// Probes are background jobs: admitted, one answers 202 at once and queues; shed, 503.
	var refused result
	for i, deadline := 0, time.Now().Add(20*time.Second); ; i++ {
		r := send(http.MethodPost, gw.URL+chatPath, chatBody(slowModel, fmt.Sprintf("queue probe %d", i), ""),
			map[string]string{"Prefer": "respond-async"})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if r.Status == http.StatusServiceUnavailable {
			refused = r
			t.Logf("probe %d shed", i)
			break
		}
		if r.Status != http.StatusAccepted {
			t.Fatalf("probe %d: status %d: %s", i, r.Status, r.Body)
		}
		if time.Now().After(deadline) {
			t.Fatal("no new intent was shed while the job queue's head waited past max_queue_wait")
		}
		time.Sleep(50 * time.Millisecond)
	}
	expectShed(t, refused)
	// A copy of the queued intent is a join, not a new execution.
	if r := send(http.MethodPost, gw.URL+chatPath, slowBody("queue second", false), map[string]string{"Idempotency-Key": "queue-second"}); r.Status != http.StatusOK {
		t.Fatalf("a copy of a queued intent while shedding: status %d: %s", r.Status, r.Body)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if r := <-queued; r.Status != http.StatusOK {
		t.Fatalf("the queued intent: status %d: %s", r.Status, r.Body)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := send(http.MethodPost, gw.URL+chatPath, chatBody(slowModel, "queue after", ""), nil)
		if r.Status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new intents still refused after the queue drained: status %d: %s", r.Status, r.Body)
		}
	}
}
