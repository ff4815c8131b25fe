package openaiwire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
)

type toolCallFunc struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type toolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolCallFunc `json:"function"`
}

type delta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	Refusal   *string    `json:"refusal,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type chunkChoice struct {
	Index        int             `json:"index"`
	Delta        delta           `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs,omitempty"`
	FinishReason *string         `json:"finish_reason"`
}

type chunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint *string         `json:"system_fingerprint,omitempty"`
	ServiceTier       *string         `json:"service_tier,omitempty"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

type message struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	Refusal   *string    `json:"refusal"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type completionChoice struct {
	Index        int             `json:"index"`
	Message      message         `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint *string            `json:"system_fingerprint,omitempty"`
	ServiceTier       *string            `json:"service_tier,omitempty"`
	Choices           []completionChoice `json:"choices"`
	Usage             *Usage             `json:"usage,omitempty"`
}

var nullJSON = json.RawMessage("null")

// Assemble builds one chat.completion body from the SSE frames of a stream (as stored: data
// frames, optionally followed by the usage frame). Content and tool-call arguments are
// concatenated per choice in order.
func Assemble(events, usageEvent []byte) ([]byte, error) {
	var out completion
	out.Object = "chat.completion"
	choices := map[int]*completionChoice{}
	var content, refusal = map[int]*bytes.Buffer{}, map[int]*bytes.Buffer{}
	err := ReadEvents(bytes.NewReader(append(append(append([]byte{}, events...), usageEvent...), DoneFrame...)), func(data []byte) error {
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("%w: chunk: %w", ErrMalformed, err)
		}
		if out.ID == "" {
			out.ID, out.Created, out.Model = c.ID, c.Created, c.Model
		}
		if c.SystemFingerprint != nil {
			out.SystemFingerprint = c.SystemFingerprint
		}
		if c.ServiceTier != nil {
			out.ServiceTier = c.ServiceTier
		}
		if len(c.Usage) > 0 && !bytes.Equal(c.Usage, nullJSON) {
			var u Usage
			if err := json.Unmarshal(c.Usage, &u); err == nil {
				out.Usage = &u
			}
		}
		for _, ch := range c.Choices {
			cc, ok := choices[ch.Index]
			if !ok {
				cc = &completionChoice{Index: ch.Index, Message: message{Role: "assistant"}, Logprobs: nullJSON}
				choices[ch.Index] = cc
				content[ch.Index], refusal[ch.Index] = &bytes.Buffer{}, &bytes.Buffer{}
			}
			if ch.Delta.Role != "" {
				cc.Message.Role = ch.Delta.Role
			}
			if ch.Delta.Content != nil {
				content[ch.Index].WriteString(*ch.Delta.Content)
			}
			if ch.Delta.Refusal != nil {
				refusal[ch.Index].WriteString(*ch.Delta.Refusal)
			}
			for _, tc := range ch.Delta.ToolCalls {
				i := 0
				if tc.Index != nil {
					i = *tc.Index
				}
				for len(cc.Message.ToolCalls) <= i {
					cc.Message.ToolCalls = append(cc.Message.ToolCalls, toolCall{})
				}
				t := &cc.Message.ToolCalls[i]
				if tc.ID != "" {
					t.ID = tc.ID
				}
				if tc.Type != "" {
					t.Type = tc.Type
				}
				if tc.Function.Name != "" {
					t.Function.Name = tc.Function.Name
				}
				t.Function.Arguments += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				cc.FinishReason = ch.FinishReason
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	idx := make([]int, 0, len(choices))
	for i := range choices {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	out.Choices = make([]completionChoice, 0, len(idx))
	for _, i := range idx {
		cc := choices[i]
		if s := content[i].String(); s != "" || len(cc.Message.ToolCalls) == 0 {
			cc.Message.Content = &s
		}
		if s := refusal[i].String(); s != "" {
			cc.Message.Refusal = &s
		}
		out.Choices = append(out.Choices, *cc)
	}
	return json.Marshal(out)
}

// Synthesize turns a chat.completion body into the frames of an equivalent stream: per
// choice one chunk with the role and the whole content, then one with the finish reason.
// The usage frame is returned separately (sent only to clients that asked for usage).
func Synthesize(body []byte) (events, usageEvent []byte, err error) {
	var c completion
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, nil, fmt.Errorf("%w: completion: %w", ErrMalformed, err)
	}
	base := chunk{ID: c.ID, Object: "chat.completion.chunk", Created: c.Created, Model: c.Model,
		SystemFingerprint: c.SystemFingerprint, ServiceTier: c.ServiceTier}
	for _, ch := range c.Choices {
		first := base
		first.Choices = []chunkChoice{{Index: ch.Index, Delta: delta{Role: ch.Message.Role, Content: ch.Message.Content,
			Refusal: ch.Message.Refusal, ToolCalls: indexToolCalls(ch.Message.ToolCalls)}}}
		last := base
		last.Choices = []chunkChoice{{Index: ch.Index, FinishReason: ch.FinishReason}}
		for _, k := range []chunk{first, last} {
			b, err := json.Marshal(k)
			if err != nil {
				return nil, nil, fmt.Errorf("openaiwire: encode chunk: %w", err)
			}
			events = AppendFrame(events, b)
		}
	}
	if c.Usage != nil {
		u := base
		u.Choices = []chunkChoice{}
		u.Usage, _ = json.Marshal(c.Usage)
		b, err := json.Marshal(u)
		if err != nil {
			return nil, nil, fmt.Errorf("openaiwire: encode usage chunk: %w", err)
		}
		usageEvent = Frame(b)
	}
	return events, usageEvent, nil
}

func indexToolCalls(tcs []toolCall) []toolCall {
	out := make([]toolCall, len(tcs))
	for i, tc := range tcs {
		i := i
		tc.Index = &i
		out[i] = tc
	}
	return out
}
