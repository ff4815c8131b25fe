package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestLoadIncompleteOpenAIEnv: OPENAI_BASE_URL without OPENAI_API_KEY is an ErrEnvIncomplete
// error naming the missing variable, unless a configured openai backend makes the variable
// unused; both set adds the backend; OPENAI_API_KEY alone (a shell's export for other tools,
// or a backend's api_key_env) starts on what the configuration says.
func TestLoadIncompleteOpenAIEnv(t *testing.T) {
	dir := t.TempDir()
	withOpenAI := filepath.Join(dir, "openai.yaml")
	if err := os.WriteFile(withOpenAI, []byte("backends:\n  - name: up\n    type: openai\n    base_url: http://127.0.0.1:9/v1\n    models: [\"*\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	minimal := filepath.Join(dir, "minimal.yaml")
	if err := os.WriteFile(minimal, []byte("log_level: info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const missingKey = "config: incomplete environment: OPENAI_BASE_URL is set but OPENAI_API_KEY is not: " +
		"set OPENAI_API_KEY too (the backend at OPENAI_BASE_URL needs its key), or unset OPENAI_BASE_URL"
	for _, tc := range []struct {
		name        string
		path        string
		base, key   string
		wantErr     string
		wantBackend bool // the "openai" convenience backend was added
	}{
		{name: "base URL without key", base: "https://api.openai.com/v1", wantErr: missingKey},
		{name: "base URL without key, with a config file", path: minimal, base: "https://api.openai.com/v1", wantErr: missingKey},
		{name: "both", base: "https://api.openai.com/v1", key: "sk-test", wantBackend: true},
		{name: "neither"},
		{name: "key alone", key: "sk-test"},
		{name: "base URL without key, openai backend configured", path: withOpenAI, base: "https://api.openai.com/v1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) string {
				switch k {
				case EnvOpenAIBaseURL:
					return tc.base
				case EnvOpenAIAPIKey:
					return tc.key
				}
				return ""
			}
			c, err := LoadWith(tc.path, getenv)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrEnvIncomplete) || err.Error() != tc.wantErr || c != nil {
					t.Fatalf("LoadWith: %v, %v; want nil and\n%s", c, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, added := c.Backend("openai")
			if added != tc.wantBackend {
				t.Errorf("openai backend added: %v, want %v (%+v)", added, tc.wantBackend, c.Backends)
			}
		})
	}
}
