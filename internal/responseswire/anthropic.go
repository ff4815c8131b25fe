package responseswire

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Anthropic is the Messages API request that runs r after history, for a route whose backend
// speaks only Anthropic Messages: the chat messages the input became are converted (system
// and developer turns into system, function calls into tool_use blocks, their outputs into
// tool_result blocks, consecutive turns of one role merged, as the API requires), always
// streamed. Anthropic requires max_tokens: defaultMaxTokens is sent when the request sets no
// max_output_tokens. A structured-output format has no Messages equivalent and is refused;
// reasoning settings are not translated.
func (r *Request) Anthropic(history []json.RawMessage, defaultMaxTokens int) ([]byte, error) {
	w := r.in
	if f := w.Text; f != nil && f.Format != nil && f.Format.Type != "text" {
		return nil, unsupported("text.format", "text.format %q is not supported on an Anthropic backend", f.Format.Type)
	}
	var system []string
	if w.Instructions != nil && *w.Instructions != "" {
		system = append(system, *w.Instructions)
	}
	var msgs []anthropicMessage
	add := func(role string, blocks ...map[string]any) {
		if n := len(msgs); n > 0 && msgs[n-1].Role == role {
			msgs[n-1].Content = append(msgs[n-1].Content, blocks...)
			return
		}
		msgs = append(msgs, anthropicMessage{Role: role, Content: blocks})
	}
	for _, raw := range append(append([]json.RawMessage{}, history...), r.input...) {
		var m chatMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, invalid("input", "input is not a valid conversation")
		}
		switch m.Role {
		case "system":
			system = append(system, contentText(m.Content))
		case "tool":
			add("user", map[string]any{"type": "tool_result", "tool_use_id": m.ToolCallID, "content": contentText(m.Content)})
		case "assistant":
			var blocks []map[string]any
			if t := contentText(m.Content); t != "" {
				blocks = append(blocks, map[string]any{"type": "text", "text": t})
			}
			for _, tc := range m.ToolCalls {
				input := json.RawMessage(tc.Function.Arguments)
				if !json.Valid(input) || len(bytes.TrimSpace(input)) == 0 || bytes.TrimSpace(input)[0] != '{' {
					input = json.RawMessage("{}")
				}
				blocks = append(blocks, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": input})
			}
			if len(blocks) > 0 {
				add("assistant", blocks...)
			}
		default: // user
			blocks, err := userBlocks(m.Content)
			if err != nil {
				return nil, err
			}
			add("user", blocks...)
		}
	}
	if len(msgs) == 0 {
		return nil, &Error{Param: "input", Code: "missing_required_parameter", Message: "input must hold at least one user or assistant turn"}
	}
	maxTokens := r.MaxOutputTokens
	if maxTokens == 0 {
		maxTokens = defaultMaxTokens
	}
	body := anthropicRequest{Model: r.Model, MaxTokens: maxTokens, Messages: msgs, Stream: true,
		Temperature: w.Temperature, TopP: w.TopP}
	if len(system) > 0 {
		body.System = strings.Join(system, "\n\n")
	}
	for _, t := range w.Tools {
		schema := t.Parameters
		if len(schema) == 0 || string(schema) == "null" {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		body.Tools = append(body.Tools, anthropicTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	if choice := anthropicToolChoice(w.ToolChoice, w.ParallelToolCalls); choice != nil && len(w.Tools) > 0 {
		body.ToolChoice = choice
	}
	if w.User != nil {
		body.Metadata = map[string]string{"user_id": *w.User}
	}
	return r.withExtra(body)
}

type anthropicRequest struct {
	Model       string             `json:"model"`
	MaxTokens   int                `json:"max_tokens"`
	System      string             `json:"system,omitempty"`
	Messages    []anthropicMessage `json:"messages"`
	Stream      bool               `json:"stream"`
	Temperature *float64           `json:"temperature,omitempty"`
	TopP        *float64           `json:"top_p,omitempty"`
	Tools       []anthropicTool    `json:"tools,omitempty"`
	ToolChoice  map[string]any     `json:"tool_choice,omitempty"`
	Metadata    map[string]string  `json:"metadata,omitempty"`
}

type anthropicMessage struct {
	Role    string           `json:"role"`
	Content []map[string]any `json:"content"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

func anthropicToolChoice(raw json.RawMessage, parallel *bool) map[string]any {
	var choice map[string]any
	var s string
	switch {
	case len(raw) == 0 || string(raw) == "null":
		choice = map[string]any{"type": "auto"}
	case json.Unmarshal(raw, &s) == nil:
		switch s {
		case "none":
			choice = map[string]any{"type": "none"}
		case "required":
			choice = map[string]any{"type": "any"}
		default:
			choice = map[string]any{"type": "auto"}
		}
	default:
		var o struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &o)
		choice = map[string]any{"type": "tool", "name": o.Name}
	}
	if parallel != nil && !*parallel && choice["type"] != "none" {
		choice["disable_parallel_tool_use"] = true
	}
	if len(raw) == 0 && parallel == nil {
		return nil // the API's default
	}
	return choice
}

// contentText is a chat content's text: the string, or its text parts joined.
func contentText(c json.RawMessage) string {
	c = bytes.TrimSpace(c)
	if len(c) == 0 || string(c) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var parts []struct {
		Type, Text string
	}
	_ = json.Unmarshal(c, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// userBlocks are a user turn's content blocks: text, and images by URL.
func userBlocks(c json.RawMessage) ([]map[string]any, error) {
	c = bytes.TrimSpace(c)
	var s string
	if json.Unmarshal(c, &s) == nil {
		return []map[string]any{{"type": "text", "text": s}}, nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL string `json:"url"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return nil, invalid("input", "input is not a valid conversation")
	}
	var out []map[string]any
	for _, p := range parts {
		switch p.Type {
		case "text":
			out = append(out, map[string]any{"type": "text", "text": p.Text})
		case "image_url":
			out = append(out, map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": p.ImageURL.URL}})
		}
	}
	return out, nil
}

// anthropicEvent is one event of a Messages stream, as far as rendering needs it.
type anthropicEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	ContentBlock *struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		Name string `json:"name"`
		Text string `json:"text"`
	} `json:"content_block"`
	Delta *struct {
		Type        string  `json:"type"`
		Text        string  `json:"text"`
		PartialJSON string  `json:"partial_json"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
}

type anthropicUsage struct {
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheReadInputTokens     int  `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int  `json:"cache_creation_input_tokens"`
}

// anthropicChunk renders one Messages stream event.
func (s *Stream) anthropicChunk(data []byte) error {
	var ev anthropicEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return err
	}
	if s.usage == nil {
		s.usage = &usage{}
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil && ev.Message.Usage != nil {
			s.anthropicUsage(ev.Message.Usage)
		}
	case "content_block_start":
		if b := ev.ContentBlock; b != nil {
			switch b.Type {
			case "tool_use":
				s.openCall(ev.Index, b.ID, b.Name)
			case "text":
				if b.Text != "" {
					s.textDelta(b.Text)
				}
			}
		}
	case "content_block_delta":
		if d := ev.Delta; d != nil {
			switch d.Type {
			case "text_delta":
				if d.Text != "" {
					s.textDelta(d.Text)
				}
			case "input_json_delta":
				if it := s.tools[ev.Index]; it != nil && d.PartialJSON != "" {
					s.argsDelta(it, d.PartialJSON)
				}
			}
		}
	case "message_delta":
		if d := ev.Delta; d != nil && d.StopReason != nil {
			switch *d.StopReason {
			case "max_tokens":
				s.finish = "length"
			case "refusal":
				s.finish = "content_filter"
			default:
				s.finish = "stop"
			}
		}
		if ev.Usage != nil {
			s.anthropicUsage(ev.Usage)
		}
	}
	return nil
}

// anthropicUsage folds a Messages usage object in: input from message_start (cache reads and
// writes are input too), output cumulative from message_delta.
func (s *Stream) anthropicUsage(u *anthropicUsage) {
	if u.InputTokens != nil {
		s.usage.InputTokens = *u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
		s.usage.InputTokensDetails.CachedTokens = u.CacheReadInputTokens
	}
	if u.OutputTokens != nil {
		s.usage.OutputTokens = *u.OutputTokens
	}
	s.usage.TotalTokens = s.usage.InputTokens + s.usage.OutputTokens
}
