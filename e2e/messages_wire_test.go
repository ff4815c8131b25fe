package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestMessagesAdmissionWireBackends: a Gemini or Azure backend speaks Chat Completions only,
// so a POST /v1/messages is admitted only to the backends of its route that speak Messages
// (dialect.Registry): a route whose only backend is one of them answers 404 model_not_found
// in Anthropic's format at admission, as a route of OpenAI backends does, and sends nothing;
// a route with a Messages-speaking backend after it is served by that one.
func TestMessagesAdmissionWireBackends(t *testing.T) {
	for _, tc := range []struct {
		typ, model string
		base       func(*wireUpstream) string
	}{
		{config.TypeGemini, geminiModel, func(u *wireUpstream) string { return u.URL + "/v1beta" }},
		{config.TypeAzure, azureModel, func(u *wireUpstream) string { return u.URL }},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			up := startWireUpstream(t, tc.model)
			cfg := gatewaykit.Config(t)
			wire := fastRetryBackend("wire", tc.typ, tc.base(up), tc.model)
			wire.APIKeyEnv = "ONCEGATE_TEST_WIRE_KEY"
			cfg.Backends = append(cfg.Backends, wire, fastRetryBackend("speaks-messages", config.TypeMock, "", "oncegate-both"))
			cfg.Routes = []config.Route{
				{Model: tc.model, Backends: []string{"wire"}},
				{Model: "oncegate-both", Backends: []string{"wire", "speaks-messages"}},
			}
			gw := gatewaykit.StartGatewayEnv(t, cfg, func(string) string { return "test-key-123" })
			mock := gw.Mock(t, "speaks-messages")
			messages := func(model string) string {
				return `{"model":"` + model + `","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
			}

			alone := do(t, http.MethodPost, gw.URL+"/v1/messages", messages(tc.model), map[string]string{"Idempotency-Key": tc.typ + "-alone"})
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(alone.Body, &e); err != nil || alone.Status != http.StatusNotFound || e.Type != "error" ||
				e.Error.Type != "not_found_error" || e.Error.Message == "" {
				t.Errorf("only the %s backend: status %d %s; want 404 not_found_error in Anthropic's format", tc.typ, alone.Status, alone.Body)
			}
			// The same route still serves Chat Completions.
			if chat := postChat(t, gw.URL, wireChat(tc.model, "still served", false), nil); chat.Status != http.StatusOK {
				t.Errorf("chat on the %s route: status %d %s", tc.typ, chat.Status, chat.Body)
			}
			sentToWire := len(up.requests())

			before := mock.Stats().Requests
			both := do(t, http.MethodPost, gw.URL+"/v1/messages", messages("oncegate-both"), map[string]string{"Idempotency-Key": tc.typ + "-both"})
			var m struct {
				Type    string `json:"type"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			}
			if err := json.Unmarshal(both.Body, &m); err != nil || both.Status != http.StatusOK || m.Type != "message" || len(m.Content) == 0 {
				t.Errorf("%s then a Messages backend: status %d %s; want 200 and an Anthropic message", tc.typ, both.Status, both.Body)
			}
			if got := mock.Stats().Requests - before; got != 1 {
				t.Errorf("the Messages backend executed %d times, want 1", got)
			}
			if got := len(up.requests()); got != sentToWire {
				t.Errorf("the %s backend was sent %d Messages requests, want none", tc.typ, got-sentToWire)
			}
		})
	}
}
