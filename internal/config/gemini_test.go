package config

import "testing"

// TestGeminiBaseURL: a Gemini backend's base_url is the API's versioned base (the gateway
// adds /models/{model}:generateContent below it), so one whose last segment is not a version
// (v1, v1beta…), which would be answered 404 on every request, is refused naming the field.
func TestGeminiBaseURL(t *testing.T) {
	for _, tt := range []struct{ name, baseURL, want string }{
		{"v1beta", "https://generativelanguage.googleapis.com/v1beta", ""},
		{"v1 with a trailing slash", "https://generativelanguage.googleapis.com/v1/", ""},
		{"a proxy's prefix", "http://127.0.0.1:9000/google/v1beta", ""},
		{"no path", "https://generativelanguage.googleapis.com", "backends[1].base_url: must end in the Gemini API version " +
			"(e.g. https://generativelanguage.googleapis.com/v1beta): the gateway adds /models/{model}:generateContent; " +
			`got "https://generativelanguage.googleapis.com"`},
		{"a path without the version", "https://generativelanguage.googleapis.com/v1beta/models", "backends[1].base_url: must end in the Gemini API version " +
			"(e.g. https://generativelanguage.googleapis.com/v1beta): the gateway adds /models/{model}:generateContent; " +
			`got "https://generativelanguage.googleapis.com/v1beta/models"`},
		{"root path", "https://generativelanguage.googleapis.com/", "backends[1].base_url: must end in the Gemini API version " +
			"(e.g. https://generativelanguage.googleapis.com/v1beta): the gateway adds /models/{model}:generateContent; " +
			`got "https://generativelanguage.googleapis.com/"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := backendProblems(Backend{Name: "g", Type: TypeGemini, BaseURL: tt.baseURL, APIKeyEnv: "GEMINI_API_KEY", Models: []string{"gemini-2.0-flash"}})
			if got != tt.want {
				t.Errorf("Validate() = %q\nwant %q", got, tt.want)
			}
		})
	}
}
