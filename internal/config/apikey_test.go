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
			got := backendProblems(Backend{Name: "b", Type: tt.typ, BaseURL: tt.baseURL, APIKeyEnv: tt.keyEnv, Models: []string{"m"}})
			if got != tt.want {
				t.Errorf("Validate() = %q\nwant %q", got, tt.want)
			}
		})
	}
}

// backendProblems is what Validate says of the default configuration with b added
// (backends[1]), "" when it is valid; b's timeout is set when it has none.
func backendProblems(b Backend) string {
	if b.Timeout == 0 {
		b.Timeout = Duration(time.Minute)
	}
	c := Default()
	c.Backends = append(c.Backends, b)
	if err := c.Validate(); err != nil {
		return err.Error()
	}
	return ""
}
