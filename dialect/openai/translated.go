package openai

import (
	"encoding/json"
	"time"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// What the dialects of other wires (gemini, bedrock) write for Chat Completions clients: a
// chat.completion, and the chat.completion.chunk frames of a translated stream.

// Completion is a chat.completion of one choice with text, finish reason finish and usage u
// (nil: zeros).
func Completion(id, model, text, finish string, u *dialect.Usage) ([]byte, error) {
	return json.Marshal(map[string]any{"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": model,
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text},
			"logprobs": nil, "finish_reason": finish}},
		"usage": UsageJSON(u)})
}

// UsageJSON is u as a Chat Completions usage object (nil: zeros).
func UsageJSON(u *dialect.Usage) map[string]int {
	if u == nil {
		u = &dialect.Usage{}
	}
	return map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.TotalTokens}
}

// Chunks writes the chat.completion.chunk frames of one translated stream: every chunk has its
// id, created time and model.
type Chunks struct {
	ID      string
	Created int64
	Model   string
}

// Append appends a chunk of one choice with delta and finish reason finish (nil: none yet).
func (c Chunks) Append(dst []byte, delta map[string]any, finish *string) []byte {
	b, _ := json.Marshal(map[string]any{"id": c.ID, "object": "chat.completion.chunk", "created": c.Created, "model": c.Model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}})
	return openaiwire.AppendFrame(dst, b)
}

// Usage is the usage-only chunk's frame (no choices) with usage u (nil: zeros).
func (c Chunks) Usage(u *dialect.Usage) []byte {
	b, _ := json.Marshal(map[string]any{"id": c.ID, "object": "chat.completion.chunk", "created": c.Created, "model": c.Model,
		"choices": []any{}, "usage": UsageJSON(u)})
	return openaiwire.Frame(b)
}
