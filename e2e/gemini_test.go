package e2e

// Google Gemini as a backend of a Chat Completions route (issue 35): the gemini dialect
// translates the request to generateContent / streamGenerateContent?alt=sse and the answer
// back, behind the same exactly-once machinery; the backend is the project's mock speaking
// Gemini's wire on a real 127.0.0.1 listener.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

const geminiModel = "gemini-2.0-flash"

// wireUpstream is a backend on 127.0.0.1 served by the mock, which records each request's
// path, query and key header, and adds the test's X-Mock-* fault headers (a dialect sends
// no "mock" member upstream).
type wireUpstream struct {
	*httptest.Server
	Mock *mockllm.Server

	mu     sync.Mutex
	faults map[string]string
	seen   []seenRequest
}

type seenRequest struct {
	path, query string
	header      http.Header
	body        []byte
}

func startWireUpstream(t testing.TB, models ...string) *wireUpstream {
	t.Helper()
	return startWireUpstreamWith(t, mockllm.Options{Models: models})
}

// startWireUpstreamWith is startWireUpstream with the mock's options.
func startWireUpstreamWith(t testing.TB, opts mockllm.Options) *wireUpstream {
	t.Helper()
	u := &wireUpstream{Mock: mockllm.New(opts), faults: map[string]string{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		r.Body = http.NoBody
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone(), body: body.Bytes()})
		for k, v := range u.faults {
			r.Header.Set(k, v)
		}
		u.mu.Unlock()
		r.Body = &readCloser{bytes.NewReader(body.Bytes())}
		u.Mock.ServeHTTP(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func (u *wireUpstream) setFaults(h map[string]string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.faults = h
}

func (u *wireUpstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

// startWireGateway starts a gateway whose route for model goes to one backend of type typ.
func startWireGateway(t *testing.T, typ, baseURL, model string, edit func(*config.Backend)) *gatewaykit.Gateway {
	t.Helper()
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("wire", typ, baseURL, model)
	b.APIKeyEnv = "ONCEGATE_TEST_WIRE_KEY"
	if edit != nil {
		edit(&b)
	}
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: model, Backends: []string{"wire"}}}
	return gatewaykit.StartGatewayEnv(t, cfg, func(name string) string {
		if name == b.APIKeyEnv {
			return "test-key-123"
		}
		return ""
	})
}

func wireChat(model, msg string, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "stream": stream, "stream_options": map[string]bool{"include_usage": stream},
		"messages": []any{map[string]string{"role": "system", "content": "be brief"}, map[string]string{"role": "user", "content": msg}}})
	if !stream {
		b, _ = json.Marshal(map[string]any{"model": model, "max_tokens": 64,
			"messages": []any{map[string]string{"role": "system", "content": "be brief"}, map[string]string{"role": "user", "content": msg}}})
	}
	return string(b)
}

// The mock's answer to a request with a system message: the chat mock seeds on every message.
func referenceWithSystem(t testing.TB, model, msg string) string {
	t.Helper()
	m := mockllm.New(mockllm.Options{Models: []string{model}})
	body, _ := json.Marshal(map[string]any{"model": model, "messages": []any{map[string]string{"role": "system", "content": "be brief"},
		map[string]string{"role": "user", "content": msg}}})
	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
	_, content, err := answerOf(rec.Body.Bytes())
	if err != nil || content == "" {
		t.Fatalf("reference answer: %v: %s", err, rec.Body.Bytes())
	}
	return content
}

func TestGeminiNonStream(t *testing.T) {
	up := startWireUpstream(t, geminiModel)
	gw := startWireGateway(t, config.TypeGemini, up.URL+"/v1beta", geminiModel, nil)
	const msg, key = "gemini: one answer", "gemini-non-stream"
	body := wireChat(geminiModel, msg, false)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	expect(t, resp, 200, "created")
	c := parseCompletion(t, resp.Body)
	if want := referenceWithSystem(t, geminiModel, msg); c.Choices[0].Message.Content != want {
		t.Errorf("content %q, want the backend's %q", c.Choices[0].Message.Content, want)
	}
	var u struct {
		Object string `json:"object"`
		Usage  struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
			Total      int `json:"total_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(resp.Body, &u)
	if u.Object != "chat.completion" || u.Usage.Completion == 0 || u.Usage.Total != u.Usage.Prompt+u.Usage.Completion {
		t.Errorf("answer %s: want a chat.completion with the usageMetadata's counts", resp.Body)
	}
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d upstream requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.path != "/v1beta/models/"+geminiModel+":generateContent" || r.query != "" {
		t.Errorf("upstream %s?%s", r.path, r.query)
	}
	if r.header.Get("x-goog-api-key") != "test-key-123" || r.header.Get("Authorization") != "" {
		t.Errorf("key headers: x-goog-api-key %q, Authorization %q", r.header.Get("x-goog-api-key"), r.header.Get("Authorization"))
	}
	var sent struct {
		Contents          []map[string]any `json:"contents"`
		SystemInstruction map[string]any   `json:"systemInstruction"`
		GenerationConfig  map[string]any   `json:"generationConfig"`
	}
	if err := json.Unmarshal(r.body, &sent); err != nil || len(sent.Contents) != 1 || sent.SystemInstruction == nil || sent.GenerationConfig["maxOutputTokens"] != float64(64) {
		t.Errorf("upstream body %s: want one content, the system instruction and maxOutputTokens 64", r.body)
	}
	expectReplayedOnce(t, gw.URL, body, key, resp, up)
}

func TestGeminiStream(t *testing.T) {
	up := startWireUpstream(t, geminiModel)
	gw := startWireGateway(t, config.TypeGemini, up.URL+"/v1beta", geminiModel, nil)
	const msg, key = "gemini: one stream", "gemini-stream"
	body := wireChat(geminiModel, msg, true)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	expect(t, resp, 200, "created")
	st := chatStreamOf(t, resp.Body)
	if want := referenceWithSystem(t, geminiModel, msg); st.Content != want || !st.Done {
		t.Errorf("transcript %q (done %v), want %q", st.Content, st.Done, want)
	}
	if !strings.HasPrefix(st.ID, "chatcmpl-") || finishChunk(st.Data) == "" || usageChunk(st.Data) <= 0 {
		t.Errorf("stream %q: want chat chunks with an id, a finish chunk and the usage chunk asked for", st.Data)
	}
	if r := up.requests(); len(r) != 1 || r[0].path != "/v1beta/models/"+geminiModel+":streamGenerateContent" || r[0].query != "alt=sse" {
		t.Errorf("upstream requests %+v, want one streamGenerateContent?alt=sse", r)
	}
	expectReplayedOnce(t, gw.URL, body, key, resp, up)
}

// A stream that breaks after output is kept with an explicit stream_interrupted error, as on
// any backend that cannot continue it, and replayed as it is.
func TestGeminiStreamBreaks(t *testing.T) {
	up := startWireUpstream(t, geminiModel)
	gw := startWireGateway(t, config.TypeGemini, up.URL+"/v1beta", geminiModel, nil)
	breaksAfterOutput(t, gw.URL, up, wireChat(geminiModel, "gemini: a stream that breaks", true), "gemini-breaks")
}

// breaksAfterOutput sends body (a stream) through the gateway at base to up, set to drop the
// stream after 3 tokens: the client gets the 3 token frames and a stream_interrupted error,
// no [DONE], and a same-key retry replays that answer after one backend execution.
func breaksAfterOutput(t *testing.T, base string, up *wireUpstream, body, key string) {
	t.Helper()
	const n = 3
	up.setFaults(map[string]string{"X-Mock-Fault": "drop_after", "X-Mock-Fault-After": "3", "X-Mock-Inter-Token-Ms": "20"})
	resp := postChat(t, base, body, map[string]string{"Idempotency-Key": key})
	if resp.Status != 200 {
		t.Fatalf("status %d: %s", resp.Status, resp.Body)
	}
	st := chatStreamOf(t, resp.Body)
	if got := tokenFrames(t, st.Data); got != n {
		t.Errorf("%d token frames, want %d", got, n)
	}
	if st.ErrCode != "stream_interrupted" || st.Done {
		t.Errorf("stream ends with error %q (done %v), want stream_interrupted and no [DONE]", st.ErrCode, st.Done)
	}
	up.setFaults(nil)
	expectReplayedOnce(t, base, body, key, resp, up)
}

// A Google error body reaches the client as an OpenAI one, stored and replayed.
func TestGeminiErrorBody(t *testing.T) {
	up := startWireUpstream(t, geminiModel)
	gw := startWireGateway(t, config.TypeGemini, up.URL+"/v1beta", geminiModel, nil)
	up.setFaults(map[string]string{"X-Mock-Fault": "error_400"})
	body := wireChat(geminiModel, "gemini: refused", false)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "gemini-400"})
	if resp.Status != 400 {
		t.Fatalf("status %d: %s", resp.Status, resp.Body)
	}
	if code := assertOpenAIError(t, resp, "invalid_argument"); code == "" {
		t.Errorf("body %s", resp.Body)
	}
}

// A request the Gemini dialect has no translation for (tools) is refused before anything is
// sent, as the client's error: 400 unsupported_by_backend of type invalid_request_error (not
// server_error, which tells a client the fault is the gateway's), streamed or not.
func TestGeminiUntranslatableIsInvalidRequest(t *testing.T) {
	up := startWireUpstream(t, geminiModel)
	gw := startWireGateway(t, config.TypeGemini, up.URL+"/v1beta", geminiModel, nil)
	for _, tc := range []struct {
		name   string
		stream bool
	}{{"non-stream", false}, {"stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
				geminiModel, tc.stream)
			before := len(up.requests())
			r := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "gemini-tools-" + tc.name})
			expectStatus(t, r, 400)
			assertOpenAIError(t, r, "unsupported_by_backend")
			var e openAIError
			_ = json.Unmarshal(r.Body, &e)
			if typ := *e.Error.Type; typ != "invalid_request_error" {
				t.Errorf("error.type %q, want invalid_request_error: %s", typ, r.Body)
			}
			if n := len(up.requests()) - before; n != 0 {
				t.Errorf("%d requests sent upstream, want none", n)
			}
		})
	}
}
