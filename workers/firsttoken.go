package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/oncegate/oncegate/internal/clock"
	"github.com/oncegate/oncegate/internal/resilience"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// A stream that breaks before its first content event had not started for any client, so it
// is sent again inside the same execution instead of being kept as a partial failure.
//
// What makes that safe is that nothing of the broken attempt left the worker: the relay holds
// a stream's opening events (OpenAI's role-only chunk; Anthropic's message_start,
// content_block_start, ping) back until the first event that carries content or ends the
// answer, and only then publishes them with it. A backend's error event before that is a
// break like a cut connection (relay.run): its frame is never published. So the CHUNKS subject of
// the epoch stays empty until an attempt gets past its first token: a joiner, a replay and
// the record all see one stream starting at index 0, with one role chunk, whose first chunk's
// metadata already counts the attempts that broke.
//
// The re-send goes to the same backend, as one more attempt: it counts against that backend's
// max_attempts and retry budget, waits its backoff, and is not made when the backoff would
// pass the client's deadline. When no attempt gets past the first token, the key is released
// (FAILED, retryable, with Retry-After): a retry with the key executes again; an outcome that
// nothing produced is never frozen for the TTL, and nothing is charged for it.

// begin releases the held opening events: the stream has started for its clients.
func (r *relay) begin() {
	if r.started {
		return
	}
	r.started = true
	if r.ex.firstChunk.IsZero() {
		r.ex.firstChunk = time.Now()
	}
	if len(r.held) > 0 {
		r.add(r.held)
		r.held = nil
	}
}

// noteTried records that attempt n (1-based) of backend name was made.
func (ex *execution) noteTried(name string, n int) {
	if ex.tried == nil {
		ex.tried = map[string]int{}
	}
	ex.tried[name] = n
}

// relayFirstToken relays the streamed answer ans, sending the request again while its stream
// breaks before the first token (see above). It returns the relay of the stream that started
// (ok: it ended properly) and the answer it came from; or a nil relay when the execution was
// settled here (stored, released, or left to a new owner).
func (ex *execution) relayFirstToken(ctx context.Context, ans *answer) (*relay, *answer, bool) {
	first := ans
	for {
		r := newRelay(ex, ans.dialect, ans.backend)
		ok := r.run(ctx, ans.resp.Body, false)
		if ans != first {
			ans.cancel() // run closed the body; the first answer's cancel is run's to defer
		}
		if r.started || ctx.Err() != nil || errors.Is(r.broke, jobs.ErrFenced) || errors.Is(r.broke, kv.ErrConflict) {
			return r, ans, ok
		}
		ans.report(false)
		ex.log.Warn().Err(r.broke).Str("backend", ans.backend.Name()).Int("attempt", ex.attempts).
			Msg("stream broke before its first token; nothing reached a client, sending it again")
		next, fail, settled := ex.resendStream(ctx, ans.backend)
		switch {
		case ctx.Err() != nil:
			return nil, nil, false // fenced or shutting down: the new owner answers
		case next == nil && settled:
			ex.finishFailed(ctx, fail) // the re-send may have run (written, no answer): kept
			return nil, nil, false
		case next == nil:
			ex.finishFailed(ctx, ex.brokeBeforeFirstToken(fail, r.broke))
			return nil, nil, false
		case next.resp.StatusCode != http.StatusOK:
			// A 4xx that will fail the same way again is the outcome: stored and replayed.
			body, _ := io.ReadAll(io.LimitReader(next.resp.Body, maxBackendBody))
			next.resp.Body.Close()
			next.cancel()
			next.report(true)
			ex.finishCompleted(ctx, &kv.Result{Status: next.resp.StatusCode, Body: next.errorBody(body)}, jobs.KindResult)
			return nil, nil, false
		}
		ans = next
		ex.backend = ans.backend.Name()
		ex.pub.SetMeta(ex.meta())
		ex.tokens.Store(0) // the broken attempt's opening events were never published
	}
}

// resendStream makes the next attempt on backend b after its stream broke before the first
// token. next is the answer; otherwise settled says whether fail is the execution's outcome
// (an attempt that may have run), or only why no attempt got through (fail may be nil: none
// was left, or the deadline is too near).
func (ex *execution) resendStream(ctx context.Context, b Backend) (next *answer, fail *failure, settled bool) {
	name, cfg := b.Name(), b.Config()
	n := ex.tried[name]
	if n >= cfg.MaxAttempts {
		return nil, nil, false
	}
	delay := resilience.Backoff(n-1, cfg.RetryBase.D(), cfg.RetryCap.D())
	if ex.pastDeadline(delay) {
		return nil, nil, false
	}
	if !clock.Sleep(ctx, delay) {
		return nil, nil, false
	}
	next, fail, settled = ex.tryBackends(ctx, ex.job.Body, []string{name})
	if next != nil {
		return next, nil, true
	}
	return nil, fail, settled
}

// brokeBeforeFirstToken is the released outcome of a stream no attempt got past the first
// token of: the last refusal of a re-send when there was one, else the break itself (the
// last attempt's, broke).
func (ex *execution) brokeBeforeFirstToken(last *failure, broke error) *failure {
	if last == nil {
		// Said as it happened: a route allowed one attempt, or its deadline no re-send (issue
		// 34: "on every attempt" after one).
		how := "on its only attempt"
		if ex.attempts > 1 {
			how = fmt.Sprintf("on all %d attempts", ex.attempts)
		}
		what, said := "the model backend's stream broke", ""
		if errors.Is(broke, errStreamEvent) {
			what, said = "the model backend reported an error in its stream", backendMessage(broke)
		}
		last = &failure{status: http.StatusBadGateway, body: ex.errorBody(http.StatusBadGateway, "backend_stream_broken",
			what+" before its first token "+how+said+"; nothing was generated, so a retry is safe")}
	}
	return released(last)
}
