package mockllm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"

	"github.com/oncegate/oncegate/internal/anthropicwire"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// serveMessages speaks the Anthropic Messages API (POST /v1/messages) on top of the chat
// mock: the request becomes the equivalent chat request (same messages, so the same
// deterministic tokens, the same knobs and faults), and the answer is translated into a
// Message or into Anthropic's named SSE events.
func (s *Server) serveMessages(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if err != nil {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "could not read the request body")
		return
	}
	var req struct {
		Model     string          `json:"model"`
		Messages  json.RawMessage `json:"messages"`
		MaxTokens *int64          `json:"max_tokens"`
		Stream    bool            `json:"stream"`
		Mock      json.RawMessage `json:"mock"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "mock: the body is not JSON")
		return
	}
	if req.MaxTokens == nil {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", "max_tokens: Field required")
		return
	}
	messages, prefilled, bad := prefillMessages(req.Messages)
	if bad != "" {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", bad)
		return
	}
	chat := map[string]any{"model": req.Model, "messages": messages, "max_tokens": *req.MaxTokens, "stream": req.Stream}
	if prefilled {
		// Assistant prefill is the chat mock's continuation: the same answer, only what follows.
		chat["continue_final_message"], chat["add_generation_prompt"] = true, false
	}
	if req.Stream {
		chat["stream_options"] = map[string]bool{"include_usage": true}
	}
	if len(req.Mock) > 0 {
		chat["mock"] = req.Mock
	}
	resp, ok := s.inner(w, r, chat, func(w http.ResponseWriter, status int, msg string) {
		writeAnthropicError(w, status, anthropicErrorType(status), msg)
	})
	if !ok {
		return
	}
	defer resp.Body.Close()
	if !req.Stream {
		var c completion
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) == 0 {
			writeAnthropicError(w, http.StatusInternalServerError, "api_error", "mock: inner answer unreadable")
			return
		}
		writeJSON(w, http.StatusOK, anthropicMessage(c.ID, c.Model, c.Choices[0].Message.Content, c.Choices[0].FinishReason, c.Usage))
		return
	}
	var msgs []any
	_ = json.Unmarshal(req.Messages, &msgs)
	s.translateStream(w, resp.Body, countPromptTokens(msgs))
}

// prefillMessages reads an assistant prefill the way Anthropic does: when the last message is
// the assistant's, the answer continues after its text and contains only what follows. The
// last message's content (a string or text blocks) becomes one string for the chat mock's
// continuation; a prefill ending in whitespace is refused, as Anthropic refuses it.
func prefillMessages(raw json.RawMessage) (msgs json.RawMessage, prefilled bool, bad string) {
	var list []map[string]json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return raw, false, "" // the chat mock reports what is wrong with it
	}
	last := list[len(list)-1]
	var role string
	if json.Unmarshal(last["role"], &role) != nil || role != "assistant" {
		return raw, false, ""
	}
	var text string
	if json.Unmarshal(last["content"], &text) != nil {
		var blocks []anthropicText
		if json.Unmarshal(last["content"], &blocks) != nil {
			return raw, false, "messages: the final assistant message's content must be a string or text blocks"
		}
		for _, b := range blocks {
			text += b.Text
		}
	}
	if strings.TrimRightFunc(text, unicode.IsSpace) != text {
		return raw, false, "messages: final assistant content cannot end with trailing whitespace"
	}
	last["content"], _ = json.Marshal(text)
	out, err := json.Marshal(list)
	if err != nil {
		return raw, false, ""
	}
	return out, true, ""
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicMsg struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

func anthropicMessage(id, model, text, finish string, u usage) anthropicMsg {
	stop := anthropicStop(finish)
	return anthropicMsg{ID: "msg_" + strings.TrimPrefix(id, idPrefix), Type: "message", Role: "assistant", Model: model,
		Content: []anthropicText{{Type: "text", Text: text}}, StopReason: &stop,
		Usage: anthropicUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}}
}

func anthropicStop(finish string) string {
	if finish == "length" {
		return "max_tokens"
	}
	return "end_turn"
}

// translateStream turns the chat mock's SSE into Anthropic's events, flushing each one; a
// broken inner stream breaks the outer one the same way.
func (s *Server) translateStream(w http.ResponseWriter, body io.Reader, inputTokens int) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sendData := func(event string, data []byte) {
		if _, err := w.Write(openaiwire.AppendNamedFrame(nil, event, data)); err != nil {
			panic(http.ErrAbortHandler)
		}
		if flush(w) != nil {
			panic(http.ErrAbortHandler)
		}
	}
	send := func(event string, v any) { sendData(event, marshal(v)) }
	er := openaiwire.NewEventReader(body)
	started, finish := false, ""
	var out int
	for {
		data, err := er.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(http.ErrAbortHandler) // the inner stream broke: so does this one
		}
		if isInStreamError(data) {
			// Anthropic's in-stream error: an error event, then the body ends (no message_stop).
			sendData("error", anthropicwire.ErrorBody("overloaded_error", "Overloaded"))
			return
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			panic(http.ErrAbortHandler)
		}
		if len(c.Choices) == 0 { // the usage chunk
			var u usage
			_ = json.Unmarshal(c.Usage, &u)
			out = u.CompletionTokens
			continue
		}
		ch := c.Choices[0]
		if !started {
			m := anthropicMessage(c.ID, c.Model, "", "", usage{})
			m.Content, m.StopReason = []anthropicText{}, nil
			m.Usage = anthropicUsage{InputTokens: inputTokens, OutputTokens: 1}
			send("message_start", map[string]any{"type": "message_start", "message": m})
			send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": anthropicText{Type: "text", Text: ""}})
			started = true
		}
		if ch.Delta.Content != nil && *ch.Delta.Content != "" {
			send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]string{"type": "text_delta", "text": *ch.Delta.Content}})
		}
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	}
	send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": anthropicStop(finish), "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": out}})
	send("message_stop", map[string]string{"type": "message_stop"})
}

func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

func writeAnthropicError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": fmt.Sprint(msg)}})
}
