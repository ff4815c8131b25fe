package workers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// relay turns a backend's SSE stream into chunks, coalescing the events one socket read
// delivered, and keeps what the record needs: every frame, the usage frame and how the stream
// ended. What the events mean (frames, usage, text for a continuation) is the dialect's
// (ex.dialect, see package dialect); the relay owns the group commit and the continuation's
// attempt.
type relay struct {
	ex *execution
	st dialect.Stream

	all, pending, usageFrame []byte
	resumed                  int
	broke                    error
	// held are the frames of a stream's opening events, kept back until its first content
	// event (started); see firsttoken.go.
	held    []byte
	started bool
}

// newRelay relays one stream of backend b in the dialect d, keeping its text for a
// continuation when b continues broken streams.
func newRelay(ex *execution, d dialect.Dialect, b Backend) *relay {
	return &relay{ex: ex, st: d.NewStream(dialect.StreamOptions{Track: b.Config().Continuation != "", Model: ex.job.Model})}
}

func (r *relay) flush(ctx context.Context) error {
	if len(r.pending) == 0 {
		return nil
	}
	err := r.publish(ctx, jobs.KindData, r.pending)
	r.pending = nil
	return err
}

// publish writes one output chunk. A fence ends the execution (its epoch was taken over);
// any other failure (NATS stayed unavailable past the retry window, CHUNKS lost with a
// restart) loses the live feed but not the answer: the stream is read from the backend to
// its end and stored, no further chunk is written (a follower must never see a gap), and
// the followers answer from the record (execution.announce writes jobs.KindStored).
func (r *relay) publish(ctx context.Context, kind jobs.Kind, payload []byte) error {
	if r.ex.feedLost != nil {
		return nil
	}
	err := r.ex.pub.Publish(ctx, kind, 0, payload)
	if err == nil || errors.Is(err, jobs.ErrFenced) || ctx.Err() != nil {
		return err
	}
	r.ex.feedLost = err
	r.ex.log.Warn().Err(err).Int("chunks", r.ex.pub.Next()).Msg("live feed lost; reading the backend to the end, followers answer from the record")
	return nil
}

// sseEvent is one event read from a backend stream (err ends the stream).
type sseEvent struct {
	name string
	data []byte
	err  error
}

// run relays one backend stream; it reports whether the stream ended properly. A reader
// goroutine keeps reading the socket while a chunk is being published, and everything read
// meanwhile goes out in the next chunk (group commit): under a fast stream the chunk rate is
// bounded by the publish round trip instead of growing with every token. With a linger
// (workers.chunk_linger), a chunk also waits until linger has passed since the previous one,
// gathering what arrives meanwhile, so the rate is at most one chunk per linger; the first
// chunk and the end of the stream never wait. run closes body before it returns.
func (r *relay) run(ctx context.Context, body io.ReadCloser, continued bool) bool {
	events := make(chan sseEvent, 256)
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		er := dialect.Events(r.st, body) // SSE, or the dialect's own framing
		for {
			name, data, err := er.NextEvent()
			ev := sseEvent{name: name, data: bytes.Clone(data), err: err}
			select {
			case events <- ev:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		r.ex.annotateAttempt(backend.AttemptSpan(body), true, r.all, r.st.Usage())
		body.Close() // unblocks a reader waiting on the socket
		<-readerDone
	}()

	first := true
	linger := r.ex.pool.opts.ChunkLinger
	var lastFlush time.Time
	var lingerTimer *time.Timer
	if linger > 0 {
		lingerTimer = time.NewTimer(linger)
		lingerTimer.Stop()
		defer lingerTimer.Stop()
	}
	for {
		ev := <-events // one event: publish it as soon as it comes…
		for {
			if ev.err != nil {
				// Streams without [DONE] (Anthropic, Responses) end after their terminal event.
				clean := ev.err == io.EOF || (r.st.Ended() && errors.Is(ev.err, openaiwire.ErrTruncated))
				if clean && r.broke == nil {
					r.begin() // a stream of opening events only (no content) is still an answer
				}
				if ferr := r.flush(ctx); ferr != nil {
					r.broke = ferr
					return false
				}
				if clean {
					return true
				}
				r.broke = ev.err
				r.ex.log.Warn().Err(ev.err).Int("chunks", r.ex.pub.Next()).Msg("backend stream broke")
				return false
			}
			dev := dialect.Event{Name: ev.name, Data: ev.data}
			var cont *dialect.Continued
			if continued {
				cont = &dialect.Continued{First: first, Resumed: r.resumed, Attempts: r.ex.earlier + r.ex.attempts}
			}
			out := r.st.Decode(dev, cont)
			first = false
			if out.Err != nil {
				// The backend's error event is a break of the stream, whatever clean end may
				// follow it (vLLM sends [DONE] after it): its frame is neither relayed nor
				// stored, and the break is handled as a broken connection is (re-sent before
				// the first token, continued, or failed with the partial output). Decoded
				// before begin, so an error as the first event has not started the stream.
				if ferr := r.flush(ctx); ferr != nil {
					r.broke = ferr
					return false
				}
				r.broke = fmt.Errorf("%w: %w", errStreamEvent, out.Err)
				r.ex.log.Warn().Err(r.broke).Int("chunks", r.ex.pub.Next()).Msg("backend reported an error in its stream; handled as a break")
				return false
			}
			if !r.started && !r.st.Opening(dev) {
				r.begin()
			}
			if out.Token {
				r.ex.tokens.Add(1)
			}
			switch {
			case out.Frame == nil:
			case r.started:
				r.add(out.Frame)
			default:
				r.held = append(r.held, out.Frame...)
			}
			if out.Usage != nil {
				// The usage chunk is published apart, after what is pending.
				r.usageFrame = out.Usage
				if err := r.flush(ctx); err != nil {
					r.broke = err
					return false
				}
				if err := r.publish(ctx, jobs.KindUsage, out.Usage); err != nil {
					r.broke = err
					return false
				}
			}
			// …together with whatever else has already been read.
			if len(r.pending) >= coalesceBytes {
				break
			}
			select {
			case ev = <-events:
				continue
			default:
			}
			// …and, with a linger, whatever arrives until linger has passed since the last chunk.
			if wait := linger - time.Since(lastFlush); lingerTimer != nil && !lastFlush.IsZero() && wait > 0 && len(r.pending) > 0 {
				lingerTimer.Reset(wait)
				select {
				case ev = <-events:
					lingerTimer.Stop()
					continue
				case <-lingerTimer.C:
				case <-ctx.Done():
				}
			}
			break
		}
		if len(r.pending) > 0 {
			lastFlush = time.Now()
		}
		if err := r.flush(ctx); err != nil {
			r.broke = err
			return false
		}
	}
}

// add appends frame to the stream's frames and to the next chunk.
func (r *relay) add(frame []byte) {
	start := len(r.all)
	r.all = append(r.all, frame...)
	r.pending = r.all[start-len(r.pending) : len(r.all) : len(r.all)]
}

// canContinue: the stream broke after output and backend b can continue it.
func (r *relay) canContinue(b Backend) bool {
	if r.broke == nil || errors.Is(r.broke, jobs.ErrFenced) || r.resumed >= 2 {
		return false
	}
	return r.st.CanContinue(b.Config())
}

// continuation asks backend b to go on from the text already sent, in the dialect's way
// (vLLM's continue_final_message, Anthropic's assistant prefill). Only the new tokens reach
// the clients.
func (r *relay) continuation(ctx context.Context, d dialect.Dialect, b Backend) (*http.Response, context.CancelFunc, error) {
	body, err := r.st.Continuation(r.ex.job.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("workers: continuation: %w", err)
	}
	call, err := r.ex.call(d, b, body, true, "")
	if err != nil {
		return nil, nil, fmt.Errorf("workers: continuation: %w", err)
	}
	report, err := r.ex.pool.guard(b.Name()).breaker.Allow(ctx)
	if err != nil {
		// Open, most likely on this stream's own break: the breaker keeps new load away, and
		// a continuation is not new load but the end of a call it admitted (issue 34: the
		// breaker refused it and the client got a truncated stream). It goes out unreported.
		report = func(bool) {}
	}
	r.ex.attempts++
	r.ex.pub.SetMeta(r.ex.meta()) // the terminal chunk says how many attempts it took
	r.ex.noteSent(b.Name(), r.ex.attempts)
	r.resumed++
	r.broke = nil
	resp, cancel, err := b.Send(ctx, call)
	r.ex.pool.countAttempt(b.Name(), resp, err, true) // a continuation is a retry of the broken attempt
	if err != nil {
		report(false)
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		report(false)
		resp.Body.Close()
		cancel()
		return nil, nil, fmt.Errorf("workers: continuation status %d", resp.StatusCode)
	}
	report(true)
	r.ex.log.Info().Int("resumed", r.resumed).Msg("continuing a broken stream")
	return resp, cancel, nil
}

// finish stores the outcome: COMPLETED with every frame, or — when the stream broke and could
// not be continued — the partial output with an explicit error (never a silent end, never a
// repeated prefix).
func (r *relay) finish(ctx context.Context, ok bool) {
	ex := r.ex
	if r.broke != nil && (errors.Is(r.broke, jobs.ErrFenced) || errors.Is(r.broke, kv.ErrConflict)) {
		ex.abandon(r.broke)
		return
	}
	if !ok {
		if len(r.all) == 0 {
			ex.finishFailed(ctx, &failure{status: http.StatusBadGateway, body: ex.errorBody(http.StatusBadGateway, "backend_truncated",
				"the model backend's stream ended before any output")})
			return
		}
		res := &kv.Result{Status: http.StatusOK, Events: r.all, Partial: true, Resumed: r.resumed, ContinuationUsage: kvUsages(r.st.ContinuationUsage()),
			Body: ex.client().StreamError(brokeMessage(r.broke))}
		ex.finishFailedAfterOutput(ctx, res)
		return
	}
	usage := kvUsage(r.st.Usage())
	if usage != nil && usage.TotalTokens == 0 {
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	}
	res := &kv.Result{Status: http.StatusOK, Events: r.all, UsageEvent: r.usageFrame, Usage: usage,
		Resumed: r.resumed, ContinuationUsage: kvUsages(r.st.ContinuationUsage())}
	ex.finishCompleted(ctx, res, jobs.KindDone)
}

// streamBrokeMessage is the message of the terminal error event of a stream that broke after
// output.
const streamBrokeMessage = "the model backend's stream broke after partial output and could not be continued; not retried to avoid a repeated prefix"

// errStreamEvent is a relay's break by the backend's own error event in the stream (a
// dialect's Out.Err), as opposed to a broken connection.
var errStreamEvent = errors.New("workers: the backend reported an error in its stream")

// brokeMessage is the message of the terminal error event of a stream that broke after output
// for the cause broke: streamBrokeMessage, or, when the backend reported an error event, one
// that says so with the backend's message text (bounded; nothing else of the event).
func brokeMessage(broke error) string {
	if !errors.Is(broke, errStreamEvent) {
		return streamBrokeMessage
	}
	return "the model backend reported an error mid-stream" + backendMessage(broke) +
		"; the partial output could not be continued and is not retried, to avoid a repeated prefix"
}

// backendMessage is ": " and the backend's message text of an error event in err (bounded),
// or "" when err has none.
func backendMessage(err error) string {
	var ee *dialect.EventError
	if !errors.As(err, &ee) || ee.Message == "" {
		return ""
	}
	return ": " + backendSaid(ee.Message)
}

// maxSaid bounds the backend's message text repeated to the clients.
const maxSaid = 200

// backendSaid is a backend's message as the gateway repeats it: at most maxSaid bytes, cut
// at a character's boundary.
func backendSaid(msg string) string {
	if len(msg) <= maxSaid {
		return msg
	}
	cut := maxSaid
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// kvUsage is a dialect's usage as the record keeps it.
func kvUsage(u *dialect.Usage) *kv.Usage {
	if u == nil {
		return nil
	}
	return &kv.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}

// kvUsages is kvUsage of each (nil for none).
func kvUsages(us []dialect.Usage) []kv.Usage {
	if len(us) == 0 {
		return nil
	}
	out := make([]kv.Usage, len(us))
	for i := range us {
		out[i] = *kvUsage(&us[i])
	}
	return out
}
