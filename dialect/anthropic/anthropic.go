// Package anthropic is the dialect of the Anthropic Messages API: the request goes to
// /messages as the client wrote it (anthropic-version added when the client sent none, the
// key in x-api-key on an Anthropic backend); named events are relayed as they are, usage read
// from message_start and the cumulative message_delta; a broken stream is continued by
// assistant prefill. A Stream is not safe for concurrent use; the rest is.
package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/internal/anthropicwire"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// ErrStreamEvent is a Stream's Out.Err (a *dialect.EventError) for an error event in the
// stream ({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}).
var ErrStreamEvent = errors.New("anthropic stream error event")

// Dialect is the Messages dialect.
type Dialect struct{}

// New returns the dialect.
func New() Dialect { return Dialect{} }

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "anthropic" }

// API implements dialect.Dialect.
func (Dialect) API() string { return dialect.APIAnthropic }

// BackendType implements dialect.Dialect: any backend asked for Messages.
func (Dialect) BackendType() string { return "" }

// Prepare sends the body to /messages with "stream" set for the execution.
func (Dialect) Prepare(req dialect.Request, b config.Backend) (dialect.Upstream, error) {
	body, err := backend.PrepareAnthropicBody(req.Body, req.Stream)
	up := dialect.Upstream{Path: "/messages", Body: body, Header: req.Header}
	if req.Header.Get("anthropic-version") == "" {
		up.Header = req.Header.Clone()
		if up.Header == nil {
			up.Header = map[string][]string{}
		}
		up.Header.Set("anthropic-version", b.AnthropicVersion)
	}
	if b.Type == config.TypeAnthropic {
		up.KeyHeader = "x-api-key"
	}
	return up, err
}

// NewStream implements dialect.Dialect.
func (Dialect) NewStream(o dialect.StreamOptions) dialect.Stream { return &Stream{model: o.Model} }

// Answer keeps the body as it is and reads its usage.
func (Dialect) Answer(body []byte, _ string) ([]byte, *dialect.Usage, error) {
	var m struct {
		Usage *struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &m) != nil || m.Usage == nil {
		return body, nil, nil
	}
	return body, &dialect.Usage{PromptTokens: m.Usage.InputTokens, CompletionTokens: m.Usage.OutputTokens,
		TotalTokens: m.Usage.InputTokens + m.Usage.OutputTokens}, nil
}

// ErrorBody keeps the backend's error body: it is already the client's API.
func (Dialect) ErrorBody(_ int, body []byte) []byte { return body }

// GatewayError is an Anthropic error body of the status's type.
func (Dialect) GatewayError(status int, _, msg string) []byte {
	return anthropicwire.ErrorBody(anthropicwire.ErrorType(status), msg)
}

// StreamError is the error event that ends a stream broken after output.
func (Dialect) StreamError(msg string) []byte {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": "api_error", "message": msg}})
	return b
}

// Degraded is the route's message as a Message.
func (Dialect) Degraded(id, model, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"id": "msg_degraded_" + id, "type": "message", "role": "assistant", "model": model,
		"content": []any{map[string]any{"type": "text", "text": msg}}, "stop_reason": "end_turn", "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": 0, "output_tokens": 0}})
	return b
}

// Stream decodes a Messages stream.
type Stream struct {
	model        string
	usage        *dialect.Usage
	contUsage    []dialect.Usage
	text         strings.Builder
	textTokens   int
	prefixTokens int
	sawStop      bool // message_stop seen
	blockIdx     int  // the index of the open content block
	// resend is the trailing whitespace a prefill was sent without: the continuation may
	// generate it again, and the clients already have it.
	resend string
}

type event struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message struct {
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	} `json:"message"`
	Delta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	Error struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Opening: message_start, content_block_start, ping, or an error event.
func (s *Stream) Opening(ev dialect.Event) bool {
	name := ev.Name
	if name == "" {
		var e struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(ev.Data, &e)
		name = e.Type
	}
	switch name {
	case "message_start", "content_block_start", "ping", "error":
		return true
	}
	return false
}

// Decode keeps the named events as they are. In a continuation, its message_start and the
// reopening of the interrupted text block are dropped, so clients see one message.
func (s *Stream) Decode(ev dialect.Event, c *dialect.Continued) dialect.Out {
	data, name := ev.Data, ev.Name
	continued := c != nil
	var e event
	_ = json.Unmarshal(data, &e)
	if name == "" {
		name = e.Type
	}
	var out dialect.Out
	switch e.Type {
	case "message_start":
		if continued {
			s.contUsage = append(s.contUsage, dialect.Usage{PromptTokens: e.Message.Usage.InputTokens})
			return dialect.Out{}
		}
		s.usage = &dialect.Usage{PromptTokens: e.Message.Usage.InputTokens, CompletionTokens: e.Message.Usage.OutputTokens}
	case "content_block_start":
		if continued && e.Index == 0 {
			return dialect.Out{}
		}
		s.blockIdx = e.Index
	case "content_block_delta":
		if continued && s.resend != "" && e.Delta.Type == "text_delta" {
			var keep bool
			if data, e.Delta.Text, keep = s.dropResent(data, e.Index, e.Delta.Text); !keep {
				return dialect.Out{}
			}
		}
		if e.Delta.Type == "text_delta" {
			s.text.WriteString(e.Delta.Text)
			s.textTokens++
		}
		out.Token = true
		if continued && e.Index == 0 && s.blockIdx != 0 {
			data = bytes.Replace(data, []byte(`"index":0`), []byte(fmt.Sprintf(`"index":%d`, s.blockIdx)), 1)
		}
	case "message_delta":
		if continued {
			data = s.continuedMessageDelta(data, e.Usage != nil, c)
		}
		if e.Usage != nil {
			if continued {
				// The continuation's usage is its own attempt (billed as such); the answer's
				// usage counts the prefix's tokens too, as the client's message_delta says.
				if n := len(s.contUsage); n > 0 {
					s.contUsage[n-1].CompletionTokens = e.Usage.OutputTokens
				}
				if s.usage != nil {
					s.usage.CompletionTokens = s.prefixTokens + e.Usage.OutputTokens
				}
			} else if s.usage != nil {
				s.usage.CompletionTokens = e.Usage.OutputTokens // cumulative: assign, never add
			}
		}
	case "message_stop":
		s.sawStop = true
	case "error":
		out.Err = &dialect.EventError{Kind: ErrStreamEvent, Message: e.Error.Message}
	}
	out.Frame = openaiwire.AppendNamedFrame(nil, name, data)
	return out
}

// Ended: message_stop was seen.
func (s *Stream) Ended() bool { return s.sawStop }

// Usage implements dialect.Stream.
func (s *Stream) Usage() *dialect.Usage { return s.usage }

// ContinuationUsage implements dialect.Stream.
func (s *Stream) ContinuationUsage() []dialect.Usage { return s.contUsage }

// continuedMessageDelta is a continuation's message_delta as the clients get it: with the
// final metadata and, in its usage, the output tokens of the one answer they saw (the
// prefix's, counted in text deltas, plus the continuation's own).
func (s *Stream) continuedMessageDelta(data []byte, hasUsage bool, c *dialect.Continued) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data
	}
	m["oncegate"] = c.Meta()
	var u map[string]json.RawMessage
	if hasUsage && json.Unmarshal(m["usage"], &u) == nil {
		var out int
		_ = json.Unmarshal(u["output_tokens"], &out)
		u["output_tokens"], _ = json.Marshal(s.prefixTokens + out)
		m["usage"], _ = json.Marshal(u)
	}
	out, err := json.Marshal(m)
	if err != nil {
		return data
	}
	return out
}

// dropResent removes from a continuation's text delta the whitespace the prefill was sent
// without (resend), which the clients already have; keep=false drops the whole event.
// Whatever follows that whitespace is new text, so stripping stops at the first other byte.
func (s *Stream) dropResent(data []byte, index int, text string) ([]byte, string, bool) {
	n := 0
	for n < len(text) && n < len(s.resend) && text[n] == s.resend[n] {
		n++
	}
	if n == len(text) {
		s.resend = s.resend[n:]
		return nil, "", false
	}
	s.resend = ""
	if n == 0 {
		return data, text, true
	}
	text = text[n:]
	out, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": index,
		"delta": map[string]string{"type": "text_delta", "text": text}})
	return out, text, true
}

// CanContinue: output was sent and the backend continues this model by prefill.
func (s *Stream) CanContinue(b config.Backend) bool {
	return s.text.Len() > 0 && b.Continuation == config.ContinuationAnthropic && slices.Contains(b.PrefillModels, s.model)
}

// Continuation is the request with the partial answer as assistant prefill. Anthropic refuses
// a prefill that ends in whitespace: it is sent without, and the whitespace the backend then
// generates again is not sent twice.
func (s *Stream) Continuation(body []byte) ([]byte, error) {
	partial := s.text.String()
	trimmed := strings.TrimRightFunc(partial, unicode.IsSpace)
	s.resend, partial = partial[len(trimmed):], trimmed
	req, msgs, err := openai.WithPrefill(body, partial)
	if err != nil {
		return nil, err
	}
	req["messages"] = msgs
	out, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	s.prefixTokens = s.textTokens
	return out, nil
}
