package httpapi

import (
	"context"
	"errors"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
)

// The one delivery loop. Every API that answers a live execution as a stream (chat
// completions, Anthropic messages, the job events, the Responses API) follows it with an
// intent.Delivery, which decides how the execution ends for this client (its terminal chunk,
// its record when that chunk never came, a restart after output, a cut); the loop writes what
// the API's render makes of each event through the one sseWriter.

// render is how one API writes a live execution's events for its client.
type render interface {
	// start is what the stream begins with (nil: nothing).
	start() []byte
	// output is a Data or Usage event as this client gets it (nil: nothing).
	output(ev intent.Event) []byte
	// end is the stream's last events for an event that ends the delivery: a terminal chunk,
	// Finished (from the record) or Restarted.
	end(ctx context.Context, ev intent.Event) []byte
	// failed is the stream's last events after err ended the delivery without an answer;
	// ok false ends it silently.
	failed(err error) (b []byte, ok bool)
}

// streamLive answers with a stream that follows d after the handler returned, rendered by r,
// starting with first (nil: d's next event). finish runs once it ended (counting, settling).
// It and everything it captures must be owned: Fiber reuses the handler's memory.
func (s *Server) streamLive(c *fiber.Ctx, out *sseWriter, d *intent.Delivery, r render, first *intent.Event, start time.Time,
	finish func(ctx context.Context, se streamEnd)) {
	h := &c.Response().Header
	se := streamEnd{backend: string(h.Peek(headerBackend)), attempts: string(h.Peek(headerAttempts))}
	var pending *intent.Event
	if first != nil {
		ev := *first
		pending = &ev
	}
	out.live(c, d, s.writeTimeout, func() {
		ctx, cancel := context.WithTimeout(context.Background(), maxGeneration)
		defer cancel()
		defer func() {
			se.bytes = out.written
			finish(ctx, se)
		}()
		out.run(ctx, d, r, pending, &se, start)
	})
}

// run is the loop: it writes r's rendering of d's events until one ends the delivery, or
// the client is gone (the execution goes on for its other copies).
func (o *sseWriter) run(ctx context.Context, d *intent.Delivery, r render, first *intent.Event, se *streamEnd, start time.Time) {
	if b := r.start(); len(b) > 0 && o.write(b) != nil {
		return
	}
	for {
		var ev intent.Event
		if first != nil {
			ev, first = *first, nil
		} else {
			var err error
			if ev, err = o.nextEvent(ctx); err != nil {
				if errors.Is(err, errClientGone) {
					return
				}
				if b, ok := r.failed(err); ok {
					_ = o.end(b)
				}
				return
			}
		}
		if ev.Kind != intent.Data && ev.Kind != intent.Usage {
			_ = o.end(r.end(ctx, ev))
			return
		}
		d.Sent(ev)
		var err error
		if b := r.output(ev); len(b) > 0 {
			err = o.write(b)
		}
		if ev.Kind == intent.Data && se.firstWrite.IsZero() {
			se.firstWrite = time.Now()
			se.ttft = se.firstWrite.Sub(start)
		}
		if err != nil {
			return // client gone
		}
	}
}

// chatRender writes chat completions and Anthropic messages.
type chatRender struct {
	w            wire
	includeUsage bool
	log          zerolog.Logger
	jobID        string
}

func (r *chatRender) start() []byte { return nil }

func (r *chatRender) output(ev intent.Event) []byte {
	if ev.Kind == intent.Usage {
		if r.includeUsage {
			return ev.Payload()
		}
		return nil
	}
	return r.w.chunkEvents(ev, r.includeUsage)
}

func (r *chatRender) end(_ context.Context, ev intent.Event) []byte {
	w := r.w
	switch ev.Kind {
	case intent.Done:
		return w.doneFrame()
	case intent.Error:
		return w.errorFrame(ev.Payload())
	case intent.Finished:
		if tail, ok := w.tail(ev, r.includeUsage); ok {
			r.log.Info().Str(fieldJobID, r.jobID).Str("state", string(ev.View.State)).Msg("stream follower ended from the record: its terminal chunk never came")
			return tail
		}
		r.log.Warn().Str(fieldJobID, r.jobID).Msg("stream follower ended without a terminal chunk")
		if ev.SameEpoch {
			return w.errorFrame(w.interrupted())
		}
	}
	// A fence (or a stray result): the execution restarted after this client got output.
	return w.errorFrame(w.restarted())
}

func (r *chatRender) failed(err error) ([]byte, bool) {
	// Never a silent end: cut.
	r.log.Warn().Err(err).Str(fieldJobID, r.jobID).Msg("stream follower ended without a terminal chunk")
	return r.w.errorFrame(r.w.interrupted()), true
}

// tail is what a chat stream still writes to end as its record's replay ends, when the
// record continues what it sent (ev.Continues): the rest of the events, the usage frame if
// asked for and not yet sent, then [DONE], or after a failure its error event.
func (w wire) tail(ev intent.Event, includeUsage bool) (out []byte, ok bool) {
	if !ev.Continues || ev.View.Answer == nil {
		return nil, false
	}
	a := ev.View.Answer
	switch {
	case a.OK():
		out = append(out, w.events(ev.Rest, includeUsage)...)
		if includeUsage && !ev.UsageSent {
			out = append(out, a.UsageEvent...)
		}
		return append(out, w.doneFrame()...), true
	case a.Failed && a.Partial:
		out = append(out, w.events(ev.Rest, includeUsage)...)
		return append(out, w.errorFrame(failureBody(w, a))...), true
	}
	return nil, false
}

// failureBody is the error a failed execution's stream ends with.
func failureBody(w wire, a *intent.Answer) []byte {
	if len(a.Body) == 0 {
		return w.errorBody(errExecutionFailed)
	}
	return a.Body
}
