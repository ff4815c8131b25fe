package config

import (
	"testing"
	"time"
)

// TestAPIKeyRequired: a backend whose API takes a key on every request (Azure OpenAI, Gemini)
// is refused without api_key_env, in one line naming the field, rather than started to be
// answered 401 (and that 401 stored under the client's key). Types a keyless server speaks
// (a local vLLM, another oncegate, the mock) need none.
func TestAPIKeyRequired(t *testing.T) {
	tests := []struct {
		typ, baseURL, keyEnv string
		want                 string // the error; "" for valid
	}{
		{TypeAzure, "https://res.openai.azure.com", "", "backends[1].api_key_env: must be set for a backend of type azure: " +
			"Azure OpenAI refuses a request without its key (api-key header; Entra ID tokens are not supported)"},
		{TypeGemini, "https://generativelanguage.googleapis.com/v1beta", "", "backends[1].api_key_env: must be set for a backend of type gemini: " +
			"the Gemini API refuses a request without its key (x-goog-api-key header)"},
		{TypeAzure, "https://res.openai.azure.com", "AZURE_OPENAI_API_KEY", ""},
		{TypeGemini, "https://generativelanguage.googleapis.com/v1beta", "GEMINI_API_KEY", ""},
		{TypeOpenAI, "http://127.0.0.1:8000/v1", "", ""},
		{TypeAnthropic, "http://127.0.0.1:8001", "", ""},
		{TypeOncegate, "http://127.0.0.1:8080/v1", "", ""},
	}
	for _, tt := range tests {
		name := tt.typ + " without a key"
		if tt.keyEnv != "" {
			name = tt.typ + " with a key"
		}
		t.Run(name, func(t *testing.T) {
			c := Default()
			c.Backends = append(c.Backends, Backend{Name: "b", Type: tt.typ, BaseURL: tt.baseURL, APIKeyEnv: tt.keyEnv,
				Models: []string{"m"}, Timeout: Duration(time.Minute)})
			got := ""
			if err := c.Validate(); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Validate() = %q\nwant %q", got, tt.want)
			}
		})
	}
}
