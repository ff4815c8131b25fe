package workers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// A backend's in-stream error event (vLLM's {"error":…} chunk before its [DONE], Anthropic's
// event: error before the end of the body) is a break of the stream, whatever the clean end
// that follows: before, the stream was stored COMPLETED with the error relayed as content,
// billed as completed and replayed forever.

// followed submits the streamed record claimed under key, follows its live chunks, and
// returns the final record, the live output (the data chunks' payloads in order) and the
// terminal chunk.
func followed(t *testing.T, r *rig, key string, rec *kv.Record, rev uint64) (*kv.Record, []byte, jobs.Chunk) {
	t.Helper()
	hub := jobs.NewHub(r.srv.NC, r.srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
	defer hub.Close()
	fl, err := hub.Open(context.Background(), jobs.ChunkSubject(key, rec.JobID, rec.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if err := jobs.Submit(context.Background(), r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var live []byte
	for {
		c, err := fl.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.Terminal() {
			return r.waitFinal(t, key), live, c
		}
		if c.Kind == jobs.KindData {
			live = append(live, c.Payload...)
		}
	}
}

// brokenAfterOutput checks a stream stored FAILED with its partial output: frames frames
// before the error, none of the backend's error event, the same live, and one terminal error
// event that says the backend's message (msg).
func brokenAfterOutput(t *testing.T, got *kv.Record, live []byte, term jobs.Chunk, frames int, msg string) {
	t.Helper()
	res := got.Result
	if got.State != kv.Failed || !res.Partial || res.Retryable || res.Status != http.StatusOK {
		t.Fatalf("state %s partial %v retryable %v status %d, want FAILED with the partial output kept", got.State, res.Partial, res.Retryable, res.Status)
	}
	if n := bytes.Count(res.Events, []byte("\n\n")); n != frames || bytes.Contains(res.Events, []byte(msg)) {
		t.Errorf("stored %d frames, want the %d before the error and not the error:\n%s", n, frames, res.Events)
	}
	if !bytes.Equal(live, res.Events) {
		t.Errorf("live output\n%s\ndiffers from the stored\n%s", live, res.Events)
	}
	if term.Kind != jobs.KindError || !bytes.Equal(term.Payload, res.Body) || !json.Valid(res.Body) ||
		!bytes.Contains(res.Body, []byte("reported an error mid-stream: "+msg)) {
		t.Errorf("terminal chunk %s %s, stored %s; want one error event naming %q", term.Kind, term.Payload, res.Body, msg)
	}
}

// TestStreamErrorEventAfterOutput: an OpenAI-compatible backend without continuation sends
// three tokens, its error chunk and [DONE]: FAILED with the four frames before the error (the
// role chunk and three tokens), one terminal error event, charged as a partial answer, not a
// completed one.
func TestStreamErrorEventAfterOutput(t *testing.T) {
	r, l := ledgerRig(t, -1)
	const key = "error-event-after-output"
	rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"a"}],"mock":{"fault":"error_event_after","fault_after":3}}`, true)
	got, live, term := followed(t, r, key, rec, rev)
	brokenAfterOutput(t, got, live, term, 4, "mock in-stream error")
	es := waitEntries(t, l, 1, "the partial answer's charge")
	if len(es) != 1 || es[0].Completed || !es[0].Estimated || es[0].OutputTokens != got.Tokens {
		t.Errorf("ledger %+v, want one estimated charge of a partial answer of %d output events", es, got.Tokens)
	}
	if n := r.mock.Mock().Stats().Requests; n != 1 {
		t.Errorf("backend executions %d, want 1 (output was sent: never re-sent)", n)
	}
}

// TestStreamErrorEventBeforeFirstTokenIsResent: the error chunk comes right after the role
// chunk, once: nothing reached a client, so the request is sent again and the second
// attempt's answer is COMPLETED, with one role chunk and no trace of the error.
func TestStreamErrorEventBeforeFirstTokenIsResent(t *testing.T) {
	r := start(t, -1)
	const key = "error-event-before-first-token"
	rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"b"}],"mock":{"fault":"error_event_after","fault_after":0,"fault_first_n":1}}`, true)
	got, live, term := followed(t, r, key, rec, rev)
	res := got.Result
	if got.State != kv.Completed || res.Status != http.StatusOK || res.Attempts != 2 || term.Kind != jobs.KindDone {
		t.Fatalf("state %s status %d attempts %d terminal %s, want COMPLETED after 2 attempts", got.State, res.Status, res.Attempts, term.Kind)
	}
	if bytes.Count(res.Events, []byte(`"role":"assistant"`)) != 1 || bytes.Contains(res.Events, []byte("mock in-stream error")) || !bytes.Equal(live, res.Events) {
		t.Errorf("stored %s\nlive %s\nwant the second attempt's stream only", res.Events, live)
	}
	if n := r.mock.Mock().Stats().Requests; n != 2 {
		t.Errorf("backend executions %d, want 2", n)
	}
}

// TestStreamErrorEventAnthropic: an Anthropic backend (the mock's /v1/messages on a real
// listener) sends three text deltas, then event: error and the end of the body: FAILED with
// message_start, content_block_start and the three deltas, and one terminal error event.
func TestStreamErrorEventAnthropic(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{Models: []string{"oncegate-mock"}}))
	t.Cleanup(up.Close)
	claude, err := backend.New(config.Backend{Name: "claude", Type: config.TypeAnthropic, BaseURL: up.URL + "/v1", Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), RetryBase: config.Duration(time.Millisecond), RetryCap: config.Duration(5 * time.Millisecond),
		Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, -1, func(o *workers.Options) { o.Backends = map[string]workers.Backend{"claude": claude} })
	const key = "error-event-anthropic"
	body := `{"model":"oncegate-mock","max_tokens":8,"messages":[{"role":"user","content":"c"}],"mock":{"fault":"error_event_after","fault_after":3}}`
	rec, rev := r.claimWith(t, key, body, func(rec *kv.Record) {
		rec.Stream, rec.API, rec.Backends = true, "anthropic", []string{"claude"}
	})
	got, live, term := followed(t, r, key, rec, rev)
	brokenAfterOutput(t, got, live, term, 5, "Overloaded")
	if bytes.Contains(got.Result.Events, []byte("event: error")) || !bytes.Contains(got.Result.Body, []byte(`"type":"error"`)) {
		t.Errorf("stored %s\nterminal %s; want the backend's error event out, the gateway's Anthropic error event last", got.Result.Events, got.Result.Body)
	}
}

// TestStreamErrorEventOnEveryAttempt: every attempt's stream reports an error before its
// first token: the key is released (FAILED, retryable, 502) with a message that says the
// backend reported an error, and what it said.
func TestStreamErrorEventOnEveryAttempt(t *testing.T) {
	r := start(t, -1)
	const key = "error-event-every-attempt"
	rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"d"}],"mock":{"fault":"error_event_after","fault_after":0}}`, true)
	got, live, term := followed(t, r, key, rec, rev)
	res := got.Result
	if got.State != kv.Failed || !res.Retryable || res.Status != http.StatusBadGateway || len(live) != 0 || term.Kind != jobs.KindError ||
		!bytes.Contains(res.Body, []byte("reported an error in its stream before its first token on all 3 attempts: mock in-stream error;")) {
		t.Fatalf("state %s retryable %v status %d, %d bytes live, terminal %s; body %s", got.State, res.Retryable, res.Status, len(live), term.Kind, res.Body)
	}
}

// TestStreamErrorEventContinued: on a backend that continues broken streams (vLLM), an error
// after output is continued like a broken connection: COMPLETED, one continuation, the error
// nowhere in the answer.
func TestStreamErrorEventContinued(t *testing.T) {
	vllm, err := backend.New(config.Backend{Name: "vllm", Type: config.TypeMock, Models: []string{"oncegate-mock"}, Continuation: config.ContinuationVLLM,
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 8}, Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, -1, func(o *workers.Options) { o.Backends = map[string]workers.Backend{"vllm": vllm} })
	const key = "error-event-continued"
	body := `{"model":"oncegate-mock","messages":[{"role":"user","content":"e"}],"mock":{"fault":"error_event_after","fault_after":3,"fault_first_n":1}}`
	rec, rev := r.claimWith(t, key, body, func(rec *kv.Record) { rec.Stream, rec.Backends = true, []string{"vllm"} })
	got, live, term := followed(t, r, key, rec, rev)
	res := got.Result
	if got.State != kv.Completed || res.Resumed != 1 || res.Attempts != 2 || term.Kind != jobs.KindDone ||
		bytes.Contains(res.Events, []byte("mock in-stream error")) || !bytes.Equal(live, res.Events) {
		t.Fatalf("state %s resumed %d attempts %d terminal %s; stored %s", got.State, res.Resumed, res.Attempts, term.Kind, res.Events)
	}
	if n := vllm.Mock().Stats().Requests; n != 2 {
		t.Errorf("backend requests %d, want 2 (the stream and its continuation)", n)
	}
}
