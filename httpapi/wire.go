package httpapi

import (
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/anthropicwire"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// wire renders answers in the format of the API a request came in on (OpenAI Chat
// Completions or Anthropic Messages): error bodies, a stream's terminal frames, and the
// stream ⇄ complete-body conversions that let copies of both kinds share one execution.
type wire struct{ anthropic bool }

func wireOf(api string) wire { return wire{anthropic: api == apiAnthropic} }

// errorBody is the API's error body for one of errorTable's errors.
func (w wire) errorBody(err error) []byte { return answer(err).body(w.anthropic) }

// errorFrame is the terminal error event of a stream carrying body.
func (w wire) errorFrame(body []byte) []byte {
	if w.anthropic {
		return openaiwire.AppendNamedFrame(nil, "error", body)
	}
	return openaiwire.Frame(body)
}

// doneFrame ends a successful stream (Anthropic's message_stop is already in the events).
func (w wire) doneFrame() []byte {
	if w.anthropic {
		return nil
	}
	return openaiwire.DoneFrame
}

// events are stored frames as a client gets them: an OpenAI client that did not ask for usage
// gets no "usage":null.
func (w wire) events(frames []byte, includeUsage bool) []byte {
	if w.anthropic || includeUsage {
		return frames
	}
	return openaiwire.WithoutNullUsage(frames)
}

// chunkEvents is events of a live Data event; the rewrite is done once per chunk for all of
// its followers.
func (w wire) chunkEvents(ev intent.Event, includeUsage bool) []byte {
	if w.anthropic || includeUsage {
		return ev.Payload()
	}
	return ev.Shared(openaiwire.WithoutNullUsage)
}

// synthesize is the stream of a complete body: its events and (OpenAI) the usage frame.
func (w wire) synthesize(body []byte) (events, usage []byte, err error) {
	if w.anthropic {
		events, err = anthropicwire.Synthesize(body)
		return events, nil, err
	}
	return openaiwire.Synthesize(body)
}

// assemble is the complete body of a stream.
func (w wire) assemble(events, usage []byte) ([]byte, error) {
	if w.anthropic {
		return anthropicwire.Assemble(events)
	}
	return openaiwire.Assemble(events, usage)
}

// Terminal error events of a stream that cannot be completed on this connection. Never a
// silent end, never a splice of two executions.
func (w wire) restarted() []byte { return w.errorBody(errRestarted) }

func (w wire) interrupted() []byte { return w.errorBody(errStreamCut) }
