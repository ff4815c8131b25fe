package mockllm

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestAnthropicPrefill: a final assistant message is continued, as Anthropic does: the answer
// holds only what follows the prefill, and the prefill plus the answer is the whole answer.
func TestAnthropicPrefill(t *testing.T) {
	forEachTransport(t, Options{Tokens: 6}, func(t *testing.T, h *harness) {
		user := map[string]any{"role": "user", "content": "prefill me"}
		msgReq := func(msgs ...any) string {
			b, _ := json.Marshal(map[string]any{"model": defaultModel, "max_tokens": 6, "messages": msgs})
			return string(b)
		}
		text := func(body []byte) string {
			m := decode[anthropicMsg](t, body)
			out := ""
			for _, c := range m.Content {
				out += c.Text
			}
			return out
		}
		resp, full := h.fetch(t, http.MethodPost, "/v1/messages", msgReq(user), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, full)
		}
		whole := text(full)
		cut := strings.LastIndexByte(whole, ' ') - 1 // ends inside a word
		tests := []struct {
			name    string
			content any
		}{
			{"string content", whole[:cut]},
			{"text blocks", []any{map[string]any{"type": "text", "text": whole[:2]}, map[string]any{"type": "text", "text": whole[2:cut]}}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, b := h.fetch(t, http.MethodPost, "/v1/messages", msgReq(user, map[string]any{"role": "assistant", "content": tt.content}), nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				if got := text(b); whole[:cut]+got != whole {
					t.Errorf("prefill %q + answer %q, want %q", whole[:cut], got, whole)
				}
			})
		}
		resp, b := h.fetch(t, http.MethodPost, "/v1/messages", msgReq(user, map[string]any{"role": "assistant", "content": whole[:cut] + " "}), nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "trailing whitespace") {
			t.Errorf("prefill ending in whitespace: %d %s, want Anthropic's 400", resp.StatusCode, b)
		}
	})
}
