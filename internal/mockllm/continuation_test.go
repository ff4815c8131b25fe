package mockllm

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

var contMessages = []any{
	map[string]any{"role": "system", "content": "You are a helpful assistant."},
	map[string]any{"role": "user", "content": "Say hello to oncegate."},
}

// contReq is the vLLM continuation of the chatReq conversation from prefix.
func contReq(t *testing.T, prefix string, fields map[string]any) string {
	t.Helper()
	msgs := append(append([]any{}, contMessages...), map[string]any{"role": "assistant", "content": prefix})
	f := map[string]any{"messages": msgs, "continue_final_message": true, "add_generation_prompt": false, "echo": false}
	for k, v := range fields {
		f[k] = v
	}
	return chatReq(t, f)
}

// fullAnswer is the unbroken answer's tokens.
func fullAnswer(t *testing.T, h *harness, fields map[string]any) (tokens []string, text string) {
	t.Helper()
	f := map[string]any{"stream": true}
	for k, v := range fields {
		f[k] = v
	}
	resp, data := h.chat(t, chatReq(t, f), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("full answer: %d %s", resp.StatusCode, data)
	}
	payloads, _ := sseFrames(t, data)
	s := summarize(t, payloads)
	return s.tokens, strings.Join(s.tokens, "")
}

func TestContinuation(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		toks, full := fullAnswer(t, h, nil)
		if len(toks) != 16 {
			t.Fatalf("%d tokens", len(toks))
		}
		prompt := decode[wireCompletion](t, func() []byte { _, d := h.chat(t, chatReq(t, nil), nil); return d }()).Usage.PromptTokens
		tests := []struct {
			name    string
			prefix  string
			newToks int // completion_tokens of the continuation
		}{
			{"empty prefix", "", 16},
			{"after 3 tokens", strings.Join(toks[:3], ""), 13},
			{"after 15 tokens", strings.Join(toks[:15], ""), 1},
			{"whole answer", full, 0},
			{"inside a token", strings.Join(toks[:4], "") + toks[4][:2], 12},
		}
		for _, tt := range tests {
			for _, stream := range []bool{true, false} {
				name := tt.name + map[bool]string{true: "/stream", false: "/non-stream"}[stream]
				t.Run(name, func(t *testing.T) {
					settle(t, h.srv) // the previous request's handler may still be counting
					h.srv.Reset()
					fields := map[string]any{"stream": stream}
					if stream {
						fields["stream_options"] = map[string]any{"include_usage": true}
					}
					resp, data := h.chat(t, contReq(t, tt.prefix, fields), nil)
					if resp.StatusCode != 200 {
						t.Fatalf("status %d: %s", resp.StatusCode, data)
					}
					wantPrompt := prompt + len(strings.Fields(tt.prefix))
					if stream {
						payloads, rest := sseFrames(t, data)
						s := summarize(t, payloads)
						if rest != "" || !s.role || !s.done || s.finish != "stop" {
							t.Fatalf("stream shape: %+v rest %q", s, rest)
						}
						if got := tt.prefix + strings.Join(s.tokens, ""); got != full {
							t.Errorf("prefix+continuation = %q, want %q", got, full)
						}
						if len(s.tokens) != tt.newToks || s.usage == nil || s.usage.CompletionTokens != tt.newToks ||
							s.usage.PromptTokens != wantPrompt || s.usage.TotalTokens != wantPrompt+tt.newToks {
							t.Errorf("%d token chunks, usage %+v; want %d new tokens, %d prompt", len(s.tokens), s.usage, tt.newToks, wantPrompt)
						}
					} else {
						c := decode[wireCompletion](t, data)
						if got := tt.prefix + c.Choices[0].Message.Content; got != full {
							t.Errorf("prefix+continuation = %q, want %q", got, full)
						}
						if c.Usage.CompletionTokens != tt.newToks || c.Usage.PromptTokens != wantPrompt || c.Choices[0].FinishReason != "stop" {
							t.Errorf("usage %+v finish %q", c.Usage, c.Choices[0].FinishReason)
						}
					}
					if st := settle(t, h.srv); st != (Stats{Requests: 1, Completed: 1}) {
						t.Errorf("stats %+v", st)
					}
				})
			}
		}
	})
}

// TestContinuationMaxTokens: max_tokens bounds the whole answer, as in the original request.
func TestContinuationMaxTokens(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		toks, full := fullAnswer(t, h, map[string]any{"max_tokens": 5})
		resp, data := h.chat(t, contReq(t, strings.Join(toks[:2], ""), map[string]any{"stream": true, "max_tokens": 5}), nil)
		payloads, _ := sseFrames(t, data)
		s := summarize(t, payloads)
		if resp.StatusCode != 200 || strings.Join(toks[:2], "")+strings.Join(s.tokens, "") != full || s.finish != "length" {
			t.Errorf("%d %+v", resp.StatusCode, s)
		}
	})
}

func TestContinuationErrors(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		toks, _ := fullAnswer(t, h, nil)
		userLast := chatReq(t, map[string]any{"continue_final_message": true, "add_generation_prompt": false})
		noAGP := chatReq(t, map[string]any{"continue_final_message": true, "messages": append(append([]any{}, contMessages...),
			map[string]any{"role": "assistant", "content": toks[0]})})
		partsContent := chatReq(t, map[string]any{"continue_final_message": true, "add_generation_prompt": false,
			"messages": append(append([]any{}, contMessages...), map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": toks[0]}}})})
		for _, tc := range []struct {
			name, body, param string
		}{
			{"not a prefix", contReq(t, "definitely not the answer", nil), "messages"},
			{"prefix of another answer", contReq(t, toks[1], nil), "messages"},
			{"last message is the user's", userLast, "messages"},
			{"add_generation_prompt defaults to true", noAGP, "add_generation_prompt"},
			{"non-string content", partsContent, "messages"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				settle(t, h.srv) // the previous request's handler may still be counting
				h.srv.Reset()
				resp, data := h.chat(t, tc.body, nil)
				e := decode[wireError](t, data)
				if resp.StatusCode != 400 || e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != tc.param {
					t.Errorf("%d %s, want 400 on %s", resp.StatusCode, data, tc.param)
				}
				if st := settle(t, h.srv); st != (Stats{Requests: 1}) {
					t.Errorf("stats %+v", st)
				}
			})
		}
	})
}

// TestContinuationAfterDrop: a stream broken by drop_after (once, fault_first_n: 1) and continued
// from what it delivered (the same knobs: the continuation is in the same fault scope) is the
// unbroken transcript.
func TestContinuationAfterDrop(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		_, full := fullAnswer(t, h, nil)
		settle(t, h.srv) // the previous request's handler may still be counting
		h.srv.Reset()
		fields := map[string]any{"stream": true, "mock": map[string]any{"fault": "drop_after", "fault_after": 4, "fault_first_n": 1}}
		resp := h.do(t, http.MethodPost, "/v1/chat/completions", chatReq(t, fields), nil)
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || errors.Is(err, io.EOF) {
			t.Fatalf("first stream ended with %v, want a broken stream", err)
		}
		payloads, _ := sseFrames(t, data)
		partial := strings.Join(summarize(t, payloads).tokens, "")

		_, data = h.chat(t, contReq(t, partial, fields), nil)
		payloads, _ = sseFrames(t, data)
		s := summarize(t, payloads)
		if got := partial + strings.Join(s.tokens, ""); got != full || !s.done || len(s.tokens) != 12 {
			t.Errorf("transcript %q (done %v), want %q", got, s.done, full)
		}
		if st := settle(t, h.srv); st != (Stats{Requests: 2, Completed: 1, Faults: 1}) {
			t.Errorf("stats %+v", st)
		}
	})
}
