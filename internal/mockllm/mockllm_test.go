package mockllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

const goldenDir = "../../testdata/mockllm"

func TestGolden(t *testing.T) {
	tests := []struct {
		file string
		body map[string]any
	}{
		{"stream.golden", map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}},
		{"stream_nousage.golden", map[string]any{"stream": true}},
		{"nonstream.golden", nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join(goldenDir, tt.file)
			body := chatReq(t, tt.body)
			for _, tc := range transports {
				t.Run(tc.name, func(t *testing.T) {
					h := tc.new(t, Options{})
					_, got := h.chat(t, body, nil)
					testkit.Golden(t, path, got) // every transport must produce the same bytes
				})
			}
		})
	}
}

func TestDeterminism(t *testing.T) {
	h := transports[1].new(t, Options{Models: []string{"oncegate-mock", "other"}})
	content := func(body string) (string, []byte) {
		t.Helper()
		resp, data := h.chat(t, body, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
		return decode[wireCompletion](t, data).Choices[0].Message.Content, data
	}
	base := chatReq(t, nil)
	c1, b1 := content(base)
	c2, b2 := content(base)
	if !bytes.Equal(b1, b2) {
		t.Fatalf("identical requests differ:\n%s\n%s", b1, b2)
	}
	// Same messages, different spelling of the JSON: same output.
	respelled := `{"messages":[ {"content":"You are a helpful assistant.","role":"system"},
		{"content":"Say hello to oncegate.","role":"user"}],"model":"oncegate-mock","n":3,"temperature":1.5,"unknown":{"x":1}}`
	if c, _ := content(respelled); c != c1 {
		t.Errorf("canonicalisation: %q != %q", c, c1)
	}
	if c1 != c2 {
		t.Fatal("unreachable")
	}
	others := map[string]string{
		"different message": chatReq(t, map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Say goodbye."}}}),
		"different model":   chatReq(t, map[string]any{"model": "other"}),
	}
	seen := map[string]string{c1: "base"}
	for name, body := range others {
		c, _ := content(body)
		if prev, dup := seen[c]; dup {
			t.Errorf("%s: same content as %s: %q", name, prev, c)
		}
		seen[c] = name
	}

	// The stream carries the same text and id as the non-stream response.
	_, sdata := h.chat(t, chatReq(t, map[string]any{"stream": true}), nil)
	payloads, _ := sseFrames(t, sdata)
	sum := summarize(t, payloads)
	if got := strings.Join(sum.tokens, ""); got != c1 {
		t.Errorf("stream content %q != non-stream %q", got, c1)
	}
	if id := decode[wireChunk](t, []byte(payloads[0])).ID; id != decode[wireCompletion](t, b1).ID {
		t.Errorf("stream id %q differs", id)
	}
}

func TestChatCompletion(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		resp, data := h.chat(t, chatReq(t, nil), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		c := decode[wireCompletion](t, data)
		if c.Object != "chat.completion" || c.Created != 1700000000 || c.Model != "oncegate-mock" {
			t.Errorf("header fields: %+v", c)
		}
		if !strings.HasPrefix(c.ID, "chatcmpl-mock-") || len(c.ID) != len("chatcmpl-mock-")+24 {
			t.Errorf("id %q", c.ID)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "stop" {
			t.Fatalf("choices: %+v", c.Choices)
		}
		words := strings.Fields(c.Choices[0].Message.Content)
		if len(words) != 16 || strings.HasPrefix(c.Choices[0].Message.Content, " ") {
			t.Errorf("content %q", c.Choices[0].Message.Content)
		}
		if c.Usage != (usage{PromptTokens: 9, CompletionTokens: 16, TotalTokens: 25}) {
			t.Errorf("usage %+v", c.Usage)
		}
		var raw struct {
			SystemFingerprint *string `json:"system_fingerprint"`
			Choices           []map[string]json.RawMessage
		}
		_ = json.Unmarshal(data, &raw)
		if raw.SystemFingerprint == nil || *raw.SystemFingerprint != "fp_oncegate_mock" {
			t.Errorf("system_fingerprint missing")
		}
		if lp, ok := raw.Choices[0]["logprobs"]; !ok || string(lp) != "null" {
			t.Errorf("logprobs = %s", lp)
		}
	})
}

func TestStream(t *testing.T) {
	for _, includeUsage := range []bool{true, false} {
		t.Run(fmt.Sprintf("include_usage=%v", includeUsage), func(t *testing.T) {
			forEachTransport(t, Options{Tokens: 5}, func(t *testing.T, h *harness) {
				body := chatReq(t, map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": includeUsage}})
				resp, data := h.chat(t, body, nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
					t.Errorf("Content-Type %q", ct)
				}
				payloads, rest := sseFrames(t, data)
				if rest != "" {
					t.Errorf("trailing bytes %q", rest)
				}
				s := summarize(t, payloads)
				if !s.role || len(s.tokens) != 5 || s.finish != "stop" || !s.done {
					t.Fatalf("summary %+v", s)
				}
				if strings.HasPrefix(s.tokens[0], " ") {
					t.Errorf("first token %q has a leading space", s.tokens[0])
				}
				for _, tok := range s.tokens[1:] {
					if !strings.HasPrefix(tok, " ") || strings.Count(tok, " ") != 1 {
						t.Errorf("token %q", tok)
					}
				}
				chunks := 1 + 5 + 1 // role, tokens, finish
				if includeUsage {
					if s.usage == nil || *s.usage != (usage{PromptTokens: 9, CompletionTokens: 5, TotalTokens: 14}) {
						t.Errorf("usage %+v", s.usage)
					}
					if s.usageNull != chunks || s.noUsage != 0 {
						t.Errorf("usage null on %d chunks, missing on %d", s.usageNull, s.noUsage)
					}
				} else {
					if s.usage != nil || s.usageNull != 0 || s.noUsage != chunks {
						t.Errorf("usage present without include_usage: %+v", s)
					}
				}
			})
		})
	}
}

func TestMaxTokens(t *testing.T) {
	tests := []struct {
		name   string
		fields map[string]any
		tokens int
		finish string
	}{
		{"none", nil, 16, "stop"},
		{"max_tokens smaller", map[string]any{"max_tokens": 5}, 5, "length"},
		{"max_completion_tokens smaller", map[string]any{"max_completion_tokens": 3}, 3, "length"},
		{"both, smaller wins", map[string]any{"max_tokens": 5, "max_completion_tokens": 2}, 2, "length"},
		{"max_tokens equal", map[string]any{"max_tokens": 16}, 16, "stop"},
		{"max_tokens larger", map[string]any{"max_tokens": 100}, 16, "stop"},
		{"max_tokens cuts knob", map[string]any{"max_tokens": 4, "mock": map[string]any{"tokens": 40}}, 4, "length"},
	}
	h := transports[1].new(t, Options{})
	_, full := h.chat(t, chatReq(t, nil), nil)
	fullContent := decode[wireCompletion](t, full).Choices[0].Message.Content
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, data := h.chat(t, chatReq(t, tt.fields), nil)
			c := decode[wireCompletion](t, data)
			content := c.Choices[0].Message.Content
			if n := len(strings.Fields(content)); n != tt.tokens || c.Usage.CompletionTokens != tt.tokens {
				t.Errorf("tokens = %d (usage %d), want %d", n, c.Usage.CompletionTokens, tt.tokens)
			}
			if c.Choices[0].FinishReason != tt.finish {
				t.Errorf("finish_reason %q, want %q", c.Choices[0].FinishReason, tt.finish)
			}
			if !strings.HasPrefix(content, fullContent) && !strings.HasPrefix(fullContent, content) {
				t.Errorf("%q is not a prefix/extension of %q", content, fullContent)
			}

			fields := map[string]any{"stream": true}
			for k, v := range tt.fields {
				fields[k] = v
			}
			_, sdata := h.chat(t, chatReq(t, fields), nil)
			payloads, _ := sseFrames(t, sdata)
			s := summarize(t, payloads)
			if len(s.tokens) != tt.tokens || s.finish != tt.finish || strings.Join(s.tokens, "") != content {
				t.Errorf("stream: %d tokens, finish %q", len(s.tokens), s.finish)
			}
		})
	}
}

func TestPromptTokens(t *testing.T) {
	h := transports[1].new(t, Options{})
	body := `{"model":"oncegate-mock","messages":[
		{"role":"system","content":"  one two\tthree\n"},
		{"role":"user","content":[{"type":"text","text":"four five"},{"type":"image_url","image_url":{"url":"x y z"}},{"type":"text","text":"six"}]},
		{"role":"assistant","content":null,"tool_calls":[]}]}`
	_, data := h.chat(t, body, nil)
	if u := decode[wireCompletion](t, data).Usage; u.PromptTokens != 6 || u.TotalTokens != 22 {
		t.Errorf("usage %+v", u)
	}
}

func TestModelsAndStats(t *testing.T) {
	forEachTransport(t, Options{Models: []string{"m-a", "m-b"}}, func(t *testing.T, h *harness) {
		resp, data := h.fetch(t, http.MethodGet, "/v1/models", "", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		want := `{"object":"list","data":[{"id":"m-a","object":"model","created":1700000000,"owned_by":"oncegate"},` +
			`{"id":"m-b","object":"model","created":1700000000,"owned_by":"oncegate"}]}` + "\n"
		if string(data) != want {
			t.Errorf("models = %s", data)
		}
		if resp, _ := h.fetch(t, http.MethodGet, "/v1/models/m-b", "", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("/v1/models/m-b: %d", resp.StatusCode)
		}
		if resp, _ := h.fetch(t, http.MethodGet, "/v1/models/nope", "", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("/v1/models/nope: %d", resp.StatusCode)
		}

		okBody := chatReq(t, map[string]any{"model": "m-a"})
		h.chat(t, okBody, nil)
		h.chat(t, chatReq(t, map[string]any{"model": "m-b", "stream": true}), nil)
		h.chat(t, okBody, map[string]string{"X-Mock-Fault": "error_503"})
		h.chat(t, `{"model":`, nil)
		h.chat(t, chatReq(t, map[string]any{"model": "m-a", "mock": map[string]any{"fault": "slow_drip", "tokens": 2, "inter_token_ms": 1}}), nil)
		settle(t, h.srv)

		resp, data = h.fetch(t, http.MethodGet, "/stats", "", nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("/stats: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		want = `{"requests":5,"completed":3,"in_flight":0,"faults":2}` + "\n"
		if string(data) != want {
			t.Errorf("/stats = %s, want %s", data, want)
		}
		if st := h.srv.Stats(); st != (Stats{Requests: 5, Completed: 3, Faults: 2}) {
			t.Errorf("Stats() = %+v", st)
		}

		resp, data = h.fetch(t, http.MethodPost, "/stats/reset", "", nil)
		if resp.StatusCode != http.StatusOK || string(data) != `{"requests":0,"completed":0,"in_flight":0,"faults":0}`+"\n" {
			t.Errorf("/stats/reset: %d %s", resp.StatusCode, data)
		}
		if st := h.srv.Stats(); st != (Stats{}) {
			t.Errorf("after reset: %+v", st)
		}
		h.chat(t, okBody, nil)
		settle(t, h.srv)
		h.srv.Reset()
		if st := h.srv.Stats(); st != (Stats{}) {
			t.Errorf("after Reset(): %+v", st)
		}
	})
}

func TestRequestErrors(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		path    string
		body    string
		hdr     map[string]string
		status  int
		param   string
		counted bool // counts as a chat request
	}{
		{"malformed json", "POST", "/v1/chat/completions", `{"model":`, nil, 400, "", true},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, nil, 400, "", true},
		{"empty body", "POST", "/v1/chat/completions", ``, nil, 400, "", true},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"oncegate-mock"}`, nil, 400, "messages", true},
		{"null messages", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":null}`, nil, 400, "messages", true},
		{"empty messages", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":[]}`, nil, 400, "messages", true},
		{"messages not array", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":"hi"}`, nil, 400, "messages", true},
		{"message not object", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":["hi"]}`, nil, 400, "messages.[0]", true},
		{"missing model", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, nil, 400, "model", true},
		{"max_tokens zero", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, nil, 400, "max_tokens", true},
		{"bad knob header", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Mock-Tokens": "many"}, 400, "X-Mock-Tokens", true},
		{"negative knob", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":[{"role":"user","content":"x"}],"mock":{"ttft_ms":-1}}`, nil, 400, "mock.ttft_ms", true},
		{"unknown fault", "POST", "/v1/chat/completions", `{"model":"oncegate-mock","messages":[{"role":"user","content":"x"}],"mock":{"fault":"meteor"}}`, nil, 400, "mock.fault", true},
		{"wrong method", "GET", "/v1/chat/completions", "", nil, 405, "", false},
		{"unknown path", "GET", "/v2/nothing", "", nil, 404, "", false},
		{"unknown path post", "POST", "/v1/completions", `{}`, nil, 404, "", false},
	}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		var counted int64
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, data := h.fetch(t, tt.method, tt.path, tt.body, tt.hdr)
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, data)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				e := decode[wireError](t, data)
				if e.Error.Message == "" || e.Error.Type != "invalid_request_error" {
					t.Errorf("error body %s", data)
				}
				if tt.param != "" && (e.Error.Param == nil || *e.Error.Param != tt.param) {
					t.Errorf("param = %v, want %q", e.Error.Param, tt.param)
				}
			})
			if tt.counted {
				counted++
			}
		}
		if st := settle(t, h.srv); st.Requests != counted || st.Completed != 0 || st.Faults != 0 {
			t.Errorf("stats %+v, want %d requests", st, counted)
		}
	})
}

func TestUnknownModel(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		resp, data := h.chat(t, chatReq(t, map[string]any{"model": "x"}), nil)
		want := "{\"error\":{\"message\":\"The model `x` does not exist\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}\n"
		if resp.StatusCode != http.StatusNotFound || string(data) != want {
			t.Errorf("%d %s", resp.StatusCode, data)
		}
	})
}

func TestKnobs(t *testing.T) {
	tests := []struct {
		name    string
		mock    map[string]any
		hdr     map[string]string
		stream  bool
		tokens  int
		minTime time.Duration
		maxTime time.Duration
		faults  int64
	}{
		{name: "tokens via header", hdr: map[string]string{"X-Mock-Tokens": "3"}, tokens: 3},
		{name: "tokens via body", mock: map[string]any{"tokens": 4}, tokens: 4},
		{name: "header wins over body", mock: map[string]any{"tokens": 4}, hdr: map[string]string{"X-Mock-Tokens": "7"}, tokens: 7},
		{name: "zero tokens", mock: map[string]any{"tokens": 0}, tokens: 0},
		{name: "ttft via header", hdr: map[string]string{"X-Mock-TTFT-Ms": "80"}, tokens: 16, minTime: 80 * time.Millisecond},
		{name: "ttft via body", mock: map[string]any{"ttft_ms": 80}, stream: true, tokens: 16, minTime: 80 * time.Millisecond},
		{name: "ttft header wins", mock: map[string]any{"ttft_ms": 5000}, hdr: map[string]string{"X-Mock-TTFT-Ms": "0"}, tokens: 16, maxTime: 2 * time.Second},
		{name: "inter-token via header, stream", hdr: map[string]string{"X-Mock-Inter-Token-Ms": "30", "X-Mock-Tokens": "4"}, stream: true, tokens: 4, minTime: 90 * time.Millisecond},
		{name: "inter-token via body, non-stream", mock: map[string]any{"inter_token_ms": 30, "tokens": 4}, tokens: 4, minTime: 120 * time.Millisecond},
		{name: "slow_drip", mock: map[string]any{"fault": "slow_drip", "tokens": 3}, stream: true, tokens: 3, minTime: 400 * time.Millisecond, faults: 1},
		{name: "slow_drip header, fast override", mock: map[string]any{"inter_token_ms": 1}, hdr: map[string]string{"X-Mock-Fault": "slow_drip", "X-Mock-Tokens": "3"}, stream: true, tokens: 3, maxTime: 300 * time.Millisecond, faults: 1},
		{name: "fault none", mock: map[string]any{"fault": "none"}, tokens: 16},
	}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				h.srv.Reset()
				fields := map[string]any{"stream": tt.stream}
				if tt.mock != nil {
					fields["mock"] = tt.mock
				}
				start := time.Now()
				resp, data := h.chat(t, chatReq(t, fields), tt.hdr)
				elapsed := time.Since(start)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, data)
				}
				var got int
				if tt.stream {
					payloads, _ := sseFrames(t, data)
					got = len(summarize(t, payloads).tokens)
				} else {
					c := decode[wireCompletion](t, data)
					got = c.Usage.CompletionTokens
					if n := len(strings.Fields(c.Choices[0].Message.Content)); n != got {
						t.Errorf("content has %d words, usage says %d", n, got)
					}
				}
				if got != tt.tokens {
					t.Errorf("tokens = %d, want %d", got, tt.tokens)
				}
				if elapsed < tt.minTime {
					t.Errorf("took %v, want >= %v", elapsed, tt.minTime)
				}
				if tt.maxTime > 0 && elapsed > tt.maxTime {
					t.Errorf("took %v, want <= %v", elapsed, tt.maxTime)
				}
				if st := settle(t, h.srv); st.Faults != tt.faults || st.Requests != 1 || st.Completed != 1 {
					t.Errorf("stats %+v", st)
				}
			})
		}
	})
}

func TestOptionsTiming(t *testing.T) {
	opts := Options{TTFT: 60 * time.Millisecond, InterToken: 15 * time.Millisecond, Tokens: 4}
	forEachTransport(t, opts, func(t *testing.T, h *harness) {
		start := time.Now()
		_, data := h.chat(t, chatReq(t, nil), nil)
		if d := time.Since(start); d < 60*time.Millisecond+4*15*time.Millisecond {
			t.Errorf("non-stream took %v", d)
		}
		if n := decode[wireCompletion](t, data).Usage.CompletionTokens; n != 4 {
			t.Errorf("tokens %d", n)
		}

		// Stream: nothing before TTFT, then tokens InterToken apart.
		start = time.Now()
		resp := h.do(t, http.MethodPost, "/v1/chat/completions", chatReq(t, map[string]any{"stream": true}), nil)
		defer resp.Body.Close()
		if d := time.Since(start); d < 60*time.Millisecond {
			t.Errorf("headers after %v, before TTFT", d)
		}
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(resp.Body); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 60*time.Millisecond+3*15*time.Millisecond {
			t.Errorf("stream took %v", d)
		}
	})
}

func TestErrorFaults(t *testing.T) {
	tests := []struct {
		fault      string
		retryAfter string // knob; "" = default
		status     int
		typ        string
		code       string // "" = null
		hdr        map[string]string
	}{
		{fault: "error_500", status: 500, typ: "server_error"},
		{fault: "error_502", status: 502, typ: "server_error"},
		{fault: "error_503", status: 503, typ: "server_error"},
		{fault: "error_504", status: 504, typ: "server_error"},
		{fault: "error_400", status: 400, typ: "invalid_request_error"},
		{fault: "error_401", status: 401, typ: "invalid_request_error", code: "invalid_api_key"},
		{fault: "rate_limit", status: 429, typ: "requests", code: "rate_limit_exceeded",
			hdr: map[string]string{"Retry-After": "1", "Retry-After-Ms": "1000"}},
		{fault: "rate_limit", retryAfter: "2", status: 429, typ: "requests", code: "rate_limit_exceeded",
			hdr: map[string]string{"Retry-After": "2", "Retry-After-Ms": "2000"}},
		{fault: "rate_limit", retryAfter: "0.25", status: 429, typ: "requests", code: "rate_limit_exceeded",
			hdr: map[string]string{"Retry-After": "0.25", "Retry-After-Ms": "250"}},
	}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tt := range tests {
			for _, via := range []string{"header", "body"} {
				t.Run(tt.fault+"/"+tt.retryAfter+"/"+via, func(t *testing.T) {
					h.srv.Reset()
					var hdr map[string]string
					var fields map[string]any
					if via == "header" {
						hdr = map[string]string{"X-Mock-Fault": tt.fault}
						if tt.retryAfter != "" {
							hdr["X-Mock-Retry-After"] = tt.retryAfter
						}
					} else {
						mock := map[string]any{"fault": tt.fault}
						if tt.retryAfter != "" {
							mock["retry_after"] = tt.retryAfter
						}
						fields = map[string]any{"mock": mock, "stream": true}
					}
					resp, data := h.chat(t, chatReq(t, fields), hdr)
					if resp.StatusCode != tt.status {
						t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
					}
					if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
						t.Errorf("Content-Type %q", ct)
					}
					for k, v := range tt.hdr {
						if got := resp.Header.Get(k); got != v {
							t.Errorf("%s = %q, want %q", k, got, v)
						}
					}
					if tt.fault != "rate_limit" && resp.Header.Get("Retry-After") != "" {
						t.Errorf("unexpected Retry-After")
					}
					e := decode[wireError](t, data)
					if e.Error.Type != tt.typ || e.Error.Message == "" {
						t.Errorf("error %s", data)
					}
					if (tt.code == "" && e.Error.Code != nil) || (tt.code != "" && (e.Error.Code == nil || *e.Error.Code != tt.code)) {
						t.Errorf("code in %s, want %q", data, tt.code)
					}
					if strings.HasPrefix(tt.fault, "error_") && e.Error.Message != "mock: injected "+strings.TrimPrefix(tt.fault, "error_") {
						t.Errorf("message %q", e.Error.Message)
					}
					if st := settle(t, h.srv); st != (Stats{Requests: 1, Faults: 1}) {
						t.Errorf("stats %+v", st)
					}
				})
			}
		}
	})
}

func TestConcurrentCounting(t *testing.T) {
	forEachTransport(t, Options{Tokens: 4}, func(t *testing.T, h *harness) {
		const n = 40
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fields := map[string]any{"stream": i%2 == 0}
				if i%4 == 1 {
					fields["mock"] = map[string]any{"fault": "error_500"}
				}
				resp, err := h.doCtx(t.Context(), http.MethodPost, "/v1/chat/completions", chatReq(t, fields), nil)
				if err != nil {
					t.Error(err)
					return
				}
				var buf bytes.Buffer
				_, _ = buf.ReadFrom(resp.Body)
				resp.Body.Close()
			}()
		}
		wg.Wait()
		if st := settle(t, h.srv); st != (Stats{Requests: n, Completed: n - n/4, Faults: n / 4}) {
			t.Errorf("stats %+v", st)
		}
	})
}
