// Package responses is the dialect of the OpenAI Responses API on a backend that serves it
// natively (responses: native): the body, which the gateway wrote (stream on, background
// off), goes to /responses as it is; the named events are relayed as they are, the usage read
// from the terminal event's response. A Responses stream is never continued. What a client
// is told without a backend (errors, degraded answers) is in the OpenAI format, as the
// Responses API's errors are. A Stream is not safe for concurrent use; the rest is.
package responses

import (
	"encoding/json"
	"errors"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// ErrStreamEvent is a Stream's Out.Err (a *dialect.EventError) for an error event in the
// stream ({"type":"error","code":…,"message":…}).
var ErrStreamEvent = errors.New("responses stream error event")

// Dialect is the native Responses dialect; what is said without a backend is OpenAI's.
type Dialect struct{ openai.Dialect }

// New returns the dialect.
func New() Dialect { return Dialect{} }

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "responses" }

// API implements dialect.Dialect.
func (Dialect) API() string { return dialect.APIResponses }

// Prepare sends the body to /responses as it is.
func (Dialect) Prepare(req dialect.Request, _ config.Backend) (dialect.Upstream, error) {
	return dialect.Upstream{Path: "/responses", Body: req.Body, Header: req.Header}, nil
}

// NewStream implements dialect.Dialect.
func (Dialect) NewStream(dialect.StreamOptions) dialect.Stream { return &Stream{} }

// Stream decodes a Responses stream.
type Stream struct {
	usage   *dialect.Usage
	sawStop bool
}

func eventType(data []byte) string {
	var e struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(data, &e)
	return e.Type
}

// Opening: response.created, response.in_progress, response.queued.
func (s *Stream) Opening(ev dialect.Event) bool {
	switch eventType(ev.Data) {
	case "response.created", "response.in_progress", "response.queued":
		return true
	}
	return false
}

// Decode keeps an event as it is, counting text deltas as tokens and reading the usage
// from the terminal event.
func (s *Stream) Decode(ev dialect.Event, _ *dialect.Continued) dialect.Out {
	var e struct {
		Type     string `json:"type"`
		Message  string `json:"message"` // of an error event
		Response *struct {
			Usage *struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
				TotalTokens  int `json:"total_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	_ = json.Unmarshal(ev.Data, &e)
	name := ev.Name
	if name == "" {
		name = e.Type
	}
	var out dialect.Out
	switch e.Type {
	case "response.output_text.delta", "response.function_call_arguments.delta", "response.refusal.delta":
		out.Token = true
	case "response.completed", "response.incomplete", "response.failed":
		s.sawStop = true
		if e.Response != nil && e.Response.Usage != nil {
			u := e.Response.Usage
			s.usage = &dialect.Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.TotalTokens}
		}
	case "error":
		out.Err = &dialect.EventError{Kind: ErrStreamEvent, Message: e.Message}
	}
	out.Frame = openaiwire.AppendNamedFrame(nil, name, ev.Data)
	return out
}

// Ended: a terminal event (completed, incomplete, failed) was seen.
func (s *Stream) Ended() bool { return s.sawStop }

// Usage implements dialect.Stream.
func (s *Stream) Usage() *dialect.Usage { return s.usage }

// ContinuationUsage implements dialect.Stream: never continued.
func (s *Stream) ContinuationUsage() []dialect.Usage { return nil }

// CanContinue implements dialect.Stream: a Responses stream is never continued.
func (s *Stream) CanContinue(config.Backend) bool { return false }

// Continuation implements dialect.Stream; it is never called (CanContinue is false).
func (s *Stream) Continuation([]byte) ([]byte, error) {
	return nil, errors.New("dialect/responses: a Responses stream is not continued")
}
