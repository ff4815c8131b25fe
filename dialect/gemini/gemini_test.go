package gemini

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/dialect"
)

func TestTranslate(t *testing.T) {
	tests := []struct {
		name, in, want string
		bad            bool
	}{
		{"system and turns", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}]}`,
			`{"contents":[{"role":"user","parts":[{"text":"u"}]},{"role":"model","parts":[{"text":"a"}]},{"role":"user","parts":[{"text":"xy"}]}],"systemInstruction":{"parts":[{"text":"s"}]}}`, false},
		{"sampling", `{"messages":[{"role":"user","content":"u"}],"max_tokens":5,"max_completion_tokens":7,"temperature":0.5,"top_p":1,"stop":"END","seed":3}`,
			`{"contents":[{"role":"user","parts":[{"text":"u"}]}],"generationConfig":{"maxOutputTokens":7,"temperature":0.5,"topP":1,"stopSequences":["END"],"seed":3}}`, false},
		{"json mode", `{"messages":[{"role":"user","content":"u"}],"response_format":{"type":"json_object"},"stop":["a","b"]}`,
			`{"contents":[{"role":"user","parts":[{"text":"u"}]}],"generationConfig":{"stopSequences":["a","b"],"responseMimeType":"application/json"}}`, false},
		{"tools", `{"messages":[{"role":"user","content":"u"}],"tools":[{}]}`, "", true},
		{"an image", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "", true},
		{"a tool message", `{"messages":[{"role":"tool","content":"r"}]}`, "", true},
		{"n of 2", `{"messages":[{"role":"user","content":"u"}],"n":2}`, "", true},
		{"no turn", `{"messages":[{"role":"system","content":"s"}]}`, "", true},
		{"not an object", `[1]`, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Translate([]byte(tt.in))
			if tt.bad {
				if !errors.Is(err, dialect.ErrBadRequest) {
					t.Fatalf("Translate = %s, %v; want ErrBadRequest", got, err)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("Translate = %s, %v\nwant %s", got, err, tt.want)
			}
		})
	}
}

// TestStream: Gemini events become chat chunks (role first, content, finish, then the usage
// chunk apart), and the stream has ended once a finishReason came.
func TestStream(t *testing.T) {
	s := New().NewStream(dialect.StreamOptions{Model: "g"})
	first := s.Decode(dialect.Event{Data: []byte(`{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]},"index":0}],"responseId":"r1","modelVersion":"g-001"}`)}, nil)
	if !first.Token || strings.Count(string(first.Frame), "data: ") != 2 || !strings.Contains(string(first.Frame), `"role":"assistant"`) ||
		!strings.Contains(string(first.Frame), `"content":"Hel"`) || !strings.Contains(string(first.Frame), `"id":"chatcmpl-r1"`) || s.Ended() {
		t.Fatalf("first event: %+v", first)
	}
	last := s.Decode(dialect.Event{Data: []byte(`{"candidates":[{"content":{"role":"model","parts":[{"text":"lo"}]},"finishReason":"MAX_TOKENS","index":0}],"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":2,"totalTokenCount":6}}`)}, nil)
	if !strings.Contains(string(last.Frame), `"content":"lo"`) || !strings.Contains(string(last.Frame), `"finish_reason":"length"`) || !s.Ended() {
		t.Fatalf("last event: %s", last.Frame)
	}
	var u struct {
		Choices []any `json:"choices"`
		Usage   struct {
			P int `json:"prompt_tokens"`
			C int `json:"completion_tokens"`
			T int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(string(last.Usage), "data: "), "\n\n")), &u); err != nil || len(u.Choices) != 0 || u.Usage.P != 4 || u.Usage.C != 2 || u.Usage.T != 6 {
		t.Fatalf("usage chunk %q (%v)", last.Usage, err)
	}
	if got := s.Usage(); got == nil || *got != (dialect.Usage{PromptTokens: 4, CompletionTokens: 2, TotalTokens: 6}) {
		t.Errorf("Usage() = %+v", got)
	}
	if out := s.Decode(dialect.Event{Data: []byte(`{"error":{"code":500,"message":"boom","status":"INTERNAL"}}`)}, nil); !errors.Is(out.Err, ErrStreamError) || out.Err.Error() != ErrStreamError.Error()+": boom" {
		t.Errorf("error object: %+v", out)
	}
}

func TestAnswerAndErrorBody(t *testing.T) {
	d := New()
	out, u, err := d.Answer([]byte(`{"candidates":[{"content":{"parts":[{"text":"hi"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4},"responseId":"r"}`), "g")
	if err != nil || u == nil || u.TotalTokens != 4 || !strings.Contains(string(out), `"content":"hi"`) || !strings.Contains(string(out), `"finish_reason":"stop"`) {
		t.Fatalf("Answer = %s, %+v, %v", out, u, err)
	}
	if _, _, err := d.Answer([]byte(`not json`), "g"); err == nil {
		t.Error("an unreadable answer was accepted")
	}
	got := string(d.ErrorBody(429, []byte(`{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}`)))
	if want := `{"error":{"message":"quota","type":"rate_limit_error","param":null,"code":"resource_exhausted"}}`; got != want {
		t.Errorf("ErrorBody = %s\nwant %s", got, want)
	}
}

// FuzzTranslate: any body is translated to valid JSON or refused with ErrBadRequest.
func FuzzTranslate(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"u"}],"stop":["a"],"max_tokens":3}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Translate(in)
		if err != nil {
			if !errors.Is(err, dialect.ErrBadRequest) {
				t.Fatalf("error %v is not ErrBadRequest", err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON %s", out)
		}
	})
}

// FuzzStream: any event decodes without panicking, into frames that are SSE data lines of
// valid JSON.
func FuzzStream(f *testing.F) {
	f.Add([]byte(`{"candidates":[{"content":{"parts":[{"text":"a"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":1}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := New().NewStream(dialect.StreamOptions{Model: "g"})
		out := s.Decode(dialect.Event{Data: in}, nil)
		for _, frame := range [][]byte{out.Frame, out.Usage} {
			for _, ev := range strings.Split(strings.TrimSuffix(string(frame), "\n\n"), "\n\n") {
				if ev == "" {
					continue
				}
				if !strings.HasPrefix(ev, "data: ") || !json.Valid([]byte(strings.TrimPrefix(ev, "data: "))) {
					t.Fatalf("frame %q", ev)
				}
			}
		}
	})
}
