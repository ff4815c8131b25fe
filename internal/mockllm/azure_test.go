package mockllm

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

const azurePath = "/openai/deployments/oncegate-mock/chat/completions?api-version=2024-10-21"

// TestAzureRefusals: what Azure OpenAI answers before a model runs, in its error shape;
// nothing reaches the chat mock.
func TestAzureRefusals(t *testing.T) {
	key := map[string]string{"api-key": "k"}
	tests := []struct {
		name   string
		path   string
		hdr    map[string]string
		status int
		want   string
	}{
		{"no api-version", "/openai/deployments/oncegate-mock/chat/completions", key, 404,
			`{"error":{"code":"404","message":"Resource not found"}}`},
		{"empty api-version", "/openai/deployments/oncegate-mock/chat/completions?api-version=", key, 404,
			`{"error":{"code":"404","message":"Resource not found"}}`},
		{"another operation", "/openai/deployments/oncegate-mock/completions?api-version=2024-10-21", key, 404,
			`{"error":{"code":"404","message":"Resource not found"}}`},
		{"no api-key", azurePath, nil, 401,
			`{"error":{"code":"401","message":"` + azureAccessDenied + `"}}`},
		{"the key as a bearer token", azurePath, map[string]string{"Authorization": "Bearer k"}, 401,
			`{"error":{"code":"401","message":"` + azureAccessDenied + `"}}`},
		{"unknown deployment", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", key, 404,
			`{"error":{"code":"DeploymentNotFound","message":"` + azureNoDeployment + `"}}`},
	}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, body := h.fetch(t, http.MethodPost, tt.path, chatReq(t, nil), tt.hdr)
				if resp.StatusCode != tt.status || strings.TrimSpace(string(body)) != tt.want {
					t.Errorf("%d %s\nwant %d %s", resp.StatusCode, body, tt.status, tt.want)
				}
			})
		}
		if st := h.srv.Stats(); st.Requests != 0 {
			t.Errorf("%d chat requests ran, want 0", st.Requests)
		}
	})
}

// TestAzureAnswers: the deployment's model answers as the chat mock does (the body's model
// ignored), with Azure's prompt-filter results; a stream opens with Azure's prompt-filter
// chunk; chat faults answer in Azure's error shape; the content_filter fault is Azure's 400.
func TestAzureAnswers(t *testing.T) {
	key := map[string]string{"api-key": "k"}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		_, ref := h.chat(t, chatReq(t, nil), nil)
		want := decode[wireCompletion](t, ref)

		resp, body := h.fetch(t, http.MethodPost, azurePath, chatReq(t, map[string]any{"model": "gpt-4o"}), key)
		got := decode[wireCompletion](t, body)
		var pf struct {
			Filter []json.RawMessage `json:"prompt_filter_results"`
		}
		_ = json.Unmarshal(body, &pf)
		if resp.StatusCode != 200 || got.Choices[0].Message.Content != want.Choices[0].Message.Content || got.Usage != want.Usage || len(pf.Filter) != 1 {
			t.Errorf("answer %d %s\nwant the chat mock's %s with prompt_filter_results", resp.StatusCode, body, ref)
		}

		_, raw := h.fetch(t, http.MethodPost, azurePath, chatReq(t, map[string]any{"stream": true, "stream_options": map[string]bool{"include_usage": true}}), key)
		payloads, rest := sseFrames(t, raw)
		if rest != "" || len(payloads) < 2 || !strings.Contains(payloads[0], `"choices":[],`) || !strings.Contains(payloads[0], `"prompt_filter_results":[`) {
			t.Fatalf("stream %q: want Azure's prompt-filter chunk first", raw)
		}
		sum := summarize(t, payloads[1:])
		if !sum.role || strings.Join(sum.tokens, "") != want.Choices[0].Message.Content || sum.usage == nil || !sum.done {
			t.Errorf("stream %q: want the chat mock's chunks, the usage chunk and [DONE]", raw)
		}

		resp, body = h.fetch(t, http.MethodPost, azurePath, chatReq(t, nil), map[string]string{"api-key": "k", "X-Mock-Fault": "rate_limit", "X-Mock-Retry-After": "3"})
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" || !strings.HasPrefix(string(body), `{"error":{"code":"429","message":`) {
			t.Errorf("rate limit: %d (Retry-After %q) %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		resp, body = h.fetch(t, http.MethodPost, azurePath, chatReq(t, nil), map[string]string{"api-key": "k", "X-Mock-Fault": "content_filter"})
		var cf struct {
			Error struct {
				Code       string          `json:"code"`
				Param      string          `json:"param"`
				InnerError json.RawMessage `json:"innererror"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &cf); err != nil || resp.StatusCode != 400 || cf.Error.Code != "content_filter" || cf.Error.Param != "prompt" ||
			!strings.Contains(string(cf.Error.InnerError), `"ResponsibleAIPolicyViolation"`) {
			t.Errorf("content filter: %d %s", resp.StatusCode, body)
		}
		if st := settle(t, h.srv); st.Requests != 5 || st.Faults != 2 {
			t.Errorf("stats %+v, want 5 requests (reference, answer, stream, two faults) and 2 faults", st)
		}
	})
}
