// Package anthropicwire reads and writes the Anthropic Messages wire format: error bodies,
// and the two conversions that let a streamed and a non-streamed copy of one intent share one
// execution (assembling a message from its SSE events, synthesizing the events of a message).
// Usage follows the API: input tokens from message_start, output tokens from the cumulative
// message_delta. All functions are pure and safe for concurrent use.
package anthropicwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/oncegate/oncegate/internal/openaiwire"
)

// ErrMalformed is returned for input that is not the expected shape.
var ErrMalformed = errors.New("anthropicwire: malformed")

// ErrorBody is an Anthropic error body: {"type":"error","error":{"type":…,"message":…}}.
func ErrorBody(typ, message string) []byte {
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}{Type: "error", Error: struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}{typ, message}})
	return b
}

// ErrorType maps an HTTP status to Anthropic's error type.
func ErrorType(status int) string {
	switch status {
	case 400, 413, 415, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404, 405:
		return "not_found_error"
	case 409:
		return "invalid_request_error"
	case 429:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

// message is a Messages API response; content blocks are kept as raw objects in order.
type message struct {
	ID           string            `json:"id"`
	Type         string            `json:"type"`
	Role         string            `json:"role"`
	Model        string            `json:"model"`
	Content      []json.RawMessage `json:"content"`
	StopReason   *string           `json:"stop_reason"`
	StopSequence *string           `json:"stop_sequence"`
	Usage        map[string]any    `json:"usage"`
}

type event struct {
	Type         string          `json:"type"`
	Index        int             `json:"index"`
	Message      json.RawMessage `json:"message"`
	ContentBlock json.RawMessage `json:"content_block"`
	Delta        json.RawMessage `json:"delta"`
	Usage        map[string]any  `json:"usage"`
}

type delta struct {
	Type         string  `json:"type"`
	Text         string  `json:"text"`
	PartialJSON  string  `json:"partial_json"`
	Thinking     string  `json:"thinking"`
	Signature    string  `json:"signature"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type block struct {
	raw      map[string]json.RawMessage
	typ      string
	text     bytes.Buffer
	thinking bytes.Buffer
	json     bytes.Buffer
	sig      string
}

// Assemble builds the message a non-stream request would have received from the SSE frames
// of a stream (event: …/data: … frames, as stored).
func Assemble(events []byte) ([]byte, error) {
	var msg message
	blocks := map[int]*block{}
	er := openaiwire.NewEventReader(bytes.NewReader(events))
	for {
		_, data, err := er.NextEvent()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, openaiwire.ErrTruncated) {
				break
			}
			return nil, err
		}
		var e event
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, fmt.Errorf("%w: event: %w", ErrMalformed, err)
		}
		switch e.Type {
		case "message_start":
			if err := json.Unmarshal(e.Message, &msg); err != nil {
				return nil, fmt.Errorf("%w: message_start: %w", ErrMalformed, err)
			}
		case "content_block_start":
			b := &block{}
			if err := json.Unmarshal(e.ContentBlock, &b.raw); err != nil {
				return nil, fmt.Errorf("%w: content_block_start: %w", ErrMalformed, err)
			}
			_ = json.Unmarshal(b.raw["type"], &b.typ)
			blocks[e.Index] = b
		case "content_block_delta":
			b, ok := blocks[e.Index]
			if !ok {
				return nil, fmt.Errorf("%w: delta for block %d before its start", ErrMalformed, e.Index)
			}
			var d delta
			if err := json.Unmarshal(e.Delta, &d); err != nil {
				return nil, fmt.Errorf("%w: delta: %w", ErrMalformed, err)
			}
			b.text.WriteString(d.Text)
			b.json.WriteString(d.PartialJSON)
			b.thinking.WriteString(d.Thinking)
			if d.Signature != "" {
				b.sig = d.Signature
			}
		case "message_delta":
			var d delta
			if err := json.Unmarshal(e.Delta, &d); err == nil {
				msg.StopReason, msg.StopSequence = d.StopReason, d.StopSequence
			}
			if msg.Usage == nil {
				msg.Usage = map[string]any{}
			}
			for k, v := range e.Usage { // cumulative: assign, never add
				msg.Usage[k] = v
			}
		}
	}
	idx := make([]int, 0, len(blocks))
	for i := range blocks {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	msg.Content = make([]json.RawMessage, 0, len(idx))
	for _, i := range idx {
		b := blocks[i]
		switch b.typ {
		case "text":
			b.raw["text"], _ = json.Marshal(b.text.String())
		case "tool_use", "server_tool_use":
			input := json.RawMessage("{}")
			if b.json.Len() > 0 {
				if !json.Valid(b.json.Bytes()) {
					return nil, fmt.Errorf("%w: tool input is not JSON", ErrMalformed)
				}
				input = append(json.RawMessage(nil), b.json.Bytes()...)
			}
			b.raw["input"] = input
		case "thinking":
			b.raw["thinking"], _ = json.Marshal(b.thinking.String())
			if b.sig != "" {
				b.raw["signature"], _ = json.Marshal(b.sig)
			}
		}
		raw, err := json.Marshal(b.raw)
		if err != nil {
			return nil, err
		}
		msg.Content = append(msg.Content, raw)
	}
	if msg.Type == "" {
		msg.Type = "message"
	}
	return json.Marshal(msg)
}

// Synthesize turns a message into the events of an equivalent stream.
func Synthesize(body []byte) ([]byte, error) {
	var msg message
	if err := json.Unmarshal(body, &msg); err != nil {
		return nil, fmt.Errorf("%w: message: %w", ErrMalformed, err)
	}
	var out []byte
	emit := func(name string, v any) {
		b, _ := json.Marshal(v)
		out = openaiwire.AppendNamedFrame(out, name, b)
	}
	start := msg
	start.Content = []json.RawMessage{}
	start.StopReason, start.StopSequence = nil, nil
	startUsage := map[string]any{}
	for k, v := range msg.Usage {
		startUsage[k] = v
	}
	startUsage["output_tokens"] = 0
	start.Usage = startUsage
	emit("message_start", map[string]any{"type": "message_start", "message": start})
	for i, raw := range msg.Content {
		var b map[string]json.RawMessage
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, fmt.Errorf("%w: content block: %w", ErrMalformed, err)
		}
		var typ string
		_ = json.Unmarshal(b["type"], &typ)
		opening := map[string]json.RawMessage{}
		for k, v := range b {
			opening[k] = v
		}
		var d map[string]any
		switch typ {
		case "text":
			var text string
			_ = json.Unmarshal(b["text"], &text)
			opening["text"] = json.RawMessage(`""`)
			d = map[string]any{"type": "text_delta", "text": text}
		case "tool_use", "server_tool_use":
			opening["input"] = json.RawMessage(`{}`)
			d = map[string]any{"type": "input_json_delta", "partial_json": string(b["input"])}
		case "thinking":
			var th string
			_ = json.Unmarshal(b["thinking"], &th)
			opening["thinking"] = json.RawMessage(`""`)
			d = map[string]any{"type": "thinking_delta", "thinking": th}
		}
		emit("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": opening})
		if d != nil {
			emit("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": d})
		}
		emit("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	emit("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": msg.StopReason, "stop_sequence": msg.StopSequence},
		"usage": map[string]any{"output_tokens": msg.Usage["output_tokens"]}})
	emit("message_stop", map[string]any{"type": "message_stop"})
	return out, nil
}
