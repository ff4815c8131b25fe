// Package openai is the dialect of the OpenAI Chat Completions API, as OpenAI-compatible
// backends (OpenAI, vLLM, TGI, DeepSeek, another oncegate, the built-in mock) speak it: the
// request goes as the client wrote it, with the stream fields the execution needs; the
// stream's chunks are relayed as they are, the usage-only chunk apart; a broken stream is
// continued the vLLM way (continue_final_message). Other dialects that answer in Chat
// Completions frames build on it (Azure OpenAI, Gemini). A Stream is not safe for concurrent
// use; the rest is.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/jsonscan"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// ErrStreamEvent is a Stream's Out.Err (a *dialect.EventError) for an error chunk in the
// stream: {"error": …} where a chat.completion.chunk was expected, as vLLM sends mid-stream.
var ErrStreamEvent = errors.New("openai stream error event")

// Dialect is the Chat Completions dialect.
type Dialect struct{}

// New returns the dialect.
func New() Dialect { return Dialect{} }

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "openai" }

// API implements dialect.Dialect.
func (Dialect) API() string { return dialect.APIOpenAI }

// BackendType implements dialect.Dialect: every backend type no other dialect claims.
func (Dialect) BackendType() string { return "" }

// Prepare sends the body to /chat/completions with "stream" set for the execution and, for a
// stream, stream_options.include_usage (the gateway bills from usage).
func (Dialect) Prepare(req dialect.Request, _ config.Backend) (dialect.Upstream, error) {
	body, err := backend.PrepareBody(req.Body, req.Stream)
	return dialect.Upstream{Path: "/chat/completions", Body: body, Header: req.Header}, err
}

// NewStream implements dialect.Dialect.
func (Dialect) NewStream(o dialect.StreamOptions) dialect.Stream { return &Stream{track: o.Track} }

// Answer keeps the body as it is and reads its usage.
func (Dialect) Answer(body []byte, _ string) ([]byte, *dialect.Usage, error) {
	return body, UsageOf(body), nil
}

// UsageOf reads the usage of a chat.completion body (nil without one).
func UsageOf(body []byte) *dialect.Usage {
	u := openaiwire.UsageOf(body)
	if u == nil {
		return nil
	}
	return &dialect.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}

// ErrorBody keeps the backend's error body: it is already the client's API.
func (Dialect) ErrorBody(_ int, body []byte) []byte { return body }

// GatewayError is an OpenAI error body of the status's type: invalid_request_error for a
// request no backend of the route can take (400 unsupported_by_backend), server_error for
// the gateway's and the backends' failures (5xx).
func (Dialect) GatewayError(status int, code, msg string) []byte {
	return openaiwire.ErrorBody(msg, openaiwire.ErrorType(status), code, "")
}

// StreamError is the error event that ends a stream broken after output.
func (Dialect) StreamError(msg string) []byte {
	return openaiwire.ErrorBody(msg, "server_error", "stream_interrupted", "")
}

// Degraded is the route's message as a chat.completion.
func (Dialect) Degraded(id, model, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"id": "chatcmpl-degraded-" + id, "object": "chat.completion", "created": time.Now().Unix(), "model": model,
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": msg},
			"logprobs": nil, "finish_reason": "stop"}},
		"usage": map[string]int{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
	return b
}

// Stream decodes a Chat Completions stream.
type Stream struct {
	track        bool
	usage        *dialect.Usage
	contUsage    []dialect.Usage
	text         strings.Builder
	textTokens   int // content deltas sent so far (≈ tokens)
	prefixTokens int // textTokens when the last continuation started
	// the original identity of the stream, which continuation chunks are rewritten to.
	id, model string
	created   int64
}

type chunk struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// Opening: the role-only chunk that opens a stream.
func (s *Stream) Opening(ev dialect.Event) bool {
	if _, ok := openaiwire.UsageOnly(ev.Data); ok {
		return false
	}
	var c chunk
	if json.Unmarshal(ev.Data, &c) != nil {
		return false
	}
	return len(c.Choices) == 1 && c.Choices[0].Delta.Role != "" && c.Choices[0].FinishReason == nil &&
		(c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content == "")
}

// Decode relays a chunk as it is; the usage-only chunk goes apart; a continuation's chunks
// take the original stream's identity; an error chunk is the stream's failure (Out.Err).
func (s *Stream) Decode(ev dialect.Event, c *dialect.Continued) dialect.Out {
	data := ev.Data
	if msg, ok := errorEvent(data); ok {
		return dialect.Out{Err: &dialect.EventError{Kind: ErrStreamEvent, Message: msg}}
	}
	if u, ok := openaiwire.UsageOnly(data); ok {
		usage := dialect.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		if c != nil {
			// The continuation's usage is its own attempt (billed as such). The client gets
			// the usage of the one answer it saw: the continuation's prompt less the prefix it
			// was given, and the prefix's tokens plus the new ones (the prefix is counted in
			// content deltas, one per token for OpenAI-compatible servers).
			s.contUsage = append(s.contUsage, usage)
			prefix := s.prefixTokens
			whole := dialect.Usage{PromptTokens: max(0, usage.PromptTokens-prefix), CompletionTokens: prefix + usage.CompletionTokens}
			whole.TotalTokens = whole.PromptTokens + whole.CompletionTokens
			s.usage = &whole
			data = s.usageChunk(whole)
		} else {
			s.usage = &usage
		}
		return dialect.Out{Usage: openaiwire.Frame(data)}
	}
	if c != nil {
		var ok bool
		if data, ok = s.rewrite(data, c); !ok {
			return dialect.Out{}
		}
	} else if s.track {
		s.note(data)
	}
	return dialect.Out{Frame: openaiwire.AppendFrame(nil, data), Token: true}
}

// errorEvent reports whether data is an error chunk, and its message: an object with a
// top-level "error" member (not null) and no "choices", as vLLM sends it mid-stream
// ({"error":{"message":…}}) before its [DONE]; some servers send the message as a string.
// Cheap for the chunks of every stream: only a chunk that holds the bytes `"error"` (a key, or
// a whole string "error") is scanned; a content that merely quotes the word holds `\"error\"`.
func errorEvent(data []byte) (msg string, ok bool) {
	if !bytes.Contains(data, []byte(`"error"`)) {
		return "", false
	}
	members, err := jsonscan.Object(data)
	if err != nil {
		return "", false
	}
	var e []byte
	for _, m := range members {
		switch m.Name() {
		case "error":
			e = m.Value
		case "choices":
			return "", false
		}
	}
	if e == nil || string(e) == "null" {
		return "", false
	}
	var obj struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(e, &obj) == nil {
		return obj.Message, true
	}
	_ = json.Unmarshal(e, &msg) // a string; anything else is an error without a message
	return msg, true
}

// Ended: an OpenAI stream ends with [DONE], never with a terminal event.
func (s *Stream) Ended() bool { return false }

// Usage implements dialect.Stream.
func (s *Stream) Usage() *dialect.Usage { return s.usage }

// ContinuationUsage implements dialect.Stream.
func (s *Stream) ContinuationUsage() []dialect.Usage { return s.contUsage }

// usageChunk is a usage-only chunk in the original stream's identity.
func (s *Stream) usageChunk(u dialect.Usage) []byte {
	b, _ := json.Marshal(map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model,
		"choices": []any{}, "usage": map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.TotalTokens}})
	return b
}

// note remembers the stream's identity and its text, for a continuation.
func (s *Stream) note(data []byte) {
	var c chunk
	if json.Unmarshal(data, &c) != nil {
		return
	}
	if s.id == "" {
		s.id, s.created, s.model = c.ID, c.Created, c.Model
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			s.text.WriteString(*ch.Delta.Content)
			s.textTokens++
		}
	}
}

// rewrite makes a continuation chunk part of the original stream: same id, created and
// model; the continuation's opening role-only chunk is dropped; the finish chunk is marked
// with the number of continuations. ok=false drops the chunk.
func (s *Stream) rewrite(data []byte, cont *dialect.Continued) ([]byte, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return data, true
	}
	var c chunk
	_ = json.Unmarshal(data, &c)
	if len(c.Choices) == 1 && c.Choices[0].Delta.Role != "" && (c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content == "") && c.Choices[0].FinishReason == nil {
		return nil, false
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			s.text.WriteString(*ch.Delta.Content)
			s.textTokens++
		}
		if ch.FinishReason != nil {
			m["oncegate"] = cont.Meta()
		}
	}
	m["id"], _ = json.Marshal(s.id)
	m["created"], _ = json.Marshal(s.created)
	m["model"], _ = json.Marshal(s.model)
	out, err := json.Marshal(m)
	if err != nil {
		return data, true
	}
	return out, true
}

// CanContinue: output was sent and the backend continues the vLLM way.
func (s *Stream) CanContinue(b config.Backend) bool {
	return s.text.Len() > 0 && b.Continuation == config.ContinuationVLLM
}

// Continuation is the request with the partial answer as an open final assistant message
// (continue_final_message); only the new tokens reach the clients.
func (s *Stream) Continuation(body []byte) ([]byte, error) {
	req, msgs, err := WithPrefill(body, s.text.String())
	if err != nil {
		return nil, err
	}
	req["messages"] = msgs
	req["continue_final_message"] = json.RawMessage("true")
	req["add_generation_prompt"] = json.RawMessage("false")
	req["echo"] = json.RawMessage("false")
	out, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	s.prefixTokens = s.textTokens
	return out, nil
}

// WithPrefill decodes a request body and returns its members and its messages with the
// assistant message partial appended.
func WithPrefill(body []byte, partial string) (map[string]json.RawMessage, json.RawMessage, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, fmt.Errorf("dialect: continuation: %w", err)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(req["messages"], &msgs); err != nil {
		return nil, nil, fmt.Errorf("dialect: continuation messages: %w", err)
	}
	prefill, _ := json.Marshal(map[string]string{"role": "assistant", "content": partial})
	msgs = append(msgs, prefill)
	out, _ := json.Marshal(msgs)
	return req, out, nil
}
