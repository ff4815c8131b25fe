package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/oncegate/oncegate/internal/testkit"
)

var (
	examplesDir = filepath.Join("..", "..", "testdata", "config")
	invalidDir  = filepath.Join(examplesDir, "invalid")
)

// envMap returns a getenv backed by m.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

var noEnv = envMap(nil)

func ptr[T any](v T) *T { return &v }

func TestDefaultValidates(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	d := Default()
	if len(d.Backends) != 1 {
		t.Fatalf("Default() has %d backends, want 1", len(d.Backends))
	}
	want := Backend{Name: "mock", Type: "mock", Models: []string{"oncegate-mock"},
		Timeout: Duration(120 * time.Second), Mock: MockKnobs{Tokens: 16}}
	if !reflect.DeepEqual(d.Backends[0], want) {
		t.Errorf("Default().Backends[0] = %+v, want %+v", d.Backends[0], want)
	}
	// Default returns a fresh value every time.
	d.Backends[0].Models[0] = "changed"
	if Default().Backends[0].Models[0] != MockModel {
		t.Error("Default() shares state between calls")
	}
}

func TestLoadEmptyPathIsDefault(t *testing.T) {
	got, err := LoadWith("", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, Default()) {
		t.Errorf("LoadWith(\"\") = %+v, want Default() %+v", got, Default())
	}

	// The exported Load reads the real environment: neutralize it.
	for _, k := range []string{EnvListen, EnvDataDir, EnvNATSURL, EnvLogLevel, EnvRole, EnvLedgerSecret, EnvOpenAIBaseURL, EnvOpenAIAPIKey} {
		t.Setenv(k, "")
	}
	got, err = Load("")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, Default()) {
		t.Errorf("Load(\"\") = %+v, want Default() %+v", got, Default())
	}
}

func TestEmptyDocumentIsDefault(t *testing.T) {
	for _, doc := range []string{"", "# only a comment\n", "---\n", "~\n"} {
		got, err := Parse([]byte(doc))
		if err != nil {
			t.Errorf("Parse(%q) error: %v", doc, err)
			continue
		}
		if !reflect.DeepEqual(got, Default()) {
			t.Errorf("Parse(%q) = %+v, want Default()", doc, got)
		}
	}
}

func TestExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"minimal.yaml", "openai.yaml", "vllm.yaml", "split-roles.yaml"} {
		if !slices.Contains(files, filepath.Join(examplesDir, want)) {
			t.Errorf("example %s is missing", want)
		}
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, err := LoadWith(f, noEnv)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(p, c) {
				t.Errorf("Parse and load disagree:\n%+v\n%+v", p, c)
			}
			for _, m := range c.ModelNames() {
				rt, ok := c.Resolve(m)
				if !ok || len(rt.Backends) == 0 {
					t.Errorf("Resolve(%q) = %+v, %v for a listed model", m, rt, ok)
					continue
				}
				if _, ok := c.Backend(rt.Backends[0]); !ok {
					t.Errorf("Resolve(%q) names unknown backend %q", m, rt.Backends[0])
				}
			}
		})
	}
}

func TestExampleContents(t *testing.T) {
	c, err := LoadWith(filepath.Join(examplesDir, "openai.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 2 || len(c.Tenants) != 2 || len(c.Routes) != 2 {
		t.Fatalf("openai.yaml: %d backends, %d tenants, %d routes", len(c.Backends), len(c.Tenants), len(c.Routes))
	}
	if got := c.Backends[1].Mock; got != (MockKnobs{TTFT: Duration(150 * time.Millisecond), InterToken: Duration(20 * time.Millisecond), Tokens: 32}) {
		t.Errorf("mock knobs = %+v", got)
	}
	if got := c.Idempotency.RetryHeaders; !slices.Equal(got, []string{"X-Stainless-Retry-Count"}) {
		t.Errorf("retry_headers = %q", got)
	}

	c, err = LoadWith(filepath.Join(examplesDir, "vllm.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	// Omitted defaults survive, the backend list is replaced.
	if c.HTTP != Default().HTTP || c.Idempotency.TTL != Default().Idempotency.TTL {
		t.Errorf("vllm.yaml lost defaults: %+v", c)
	}
	if len(c.Backends) != 1 || c.Backends[0].BaseURL != "http://127.0.0.1:8000/v1" || c.Backends[0].Timeout.D() != 300*time.Second {
		t.Errorf("vllm.yaml backends = %+v", c.Backends)
	}

	c, err = LoadWith(filepath.Join(examplesDir, "split-roles.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Role != "api" || !strings.HasPrefix(c.NATS.URL, "nats://") {
		t.Errorf("split-roles.yaml: role %q, nats.url %q", c.Role, c.NATS.URL)
	}
	// Backend entries without timeout get the backend default.
	if c.Backends[0].Timeout.D() != DefaultBackendTimeout {
		t.Errorf("split-roles.yaml backend timeout = %s, want %s", c.Backends[0].Timeout, DefaultBackendTimeout)
	}
}

func TestBackendEntryDefaults(t *testing.T) {
	c, err := Parse([]byte("backends:\n  - {name: m, type: mock, models: [oncegate-x]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Backend{Name: "m", Type: TypeMock, Models: []string{"oncegate-x"},
		Timeout: Duration(DefaultBackendTimeout), Mock: MockKnobs{Tokens: DefaultMockTokens}}
	if !reflect.DeepEqual(c.Backends[0], want) {
		t.Errorf("got %+v, want %+v", c.Backends[0], want)
	}
	// An explicit zero is not replaced by the default: it is invalid.
	_, err = Parse([]byte("backends:\n  - {name: m, type: mock, models: [oncegate-x], timeout: 0s, mock: {tokens: 0}}\n"))
	var fe *FileError
	if !errors.As(err, &fe) || len(fe.Problems) != 2 {
		t.Errorf("explicit zeros: err = %v, want 2 problems", err)
	}
}

// TestInvalid checks every testdata/config/invalid/*.yaml fails with exactly
// the error text in the .golden file beside it: every problem of the file (syntax
// alone; otherwise unknown fields, wrong types and validation together), one line
// each as "file:line: path: message". Run with -update to rewrite.
func TestInvalid(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(invalidDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no invalid examples")
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			c, err := LoadWith(f, noEnv)
			if err == nil {
				t.Fatalf("loaded without error: %+v", c)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not match ErrInvalid: %v", err)
			}
			// Every problem at once, each line naming the file; the goldens are
			// independent of the directory.
			var fe *FileError
			if !errors.As(err, &fe) || fe.Error() != err.Error() {
				t.Fatalf("Load returned %T, not an unwrapped *FileError: %v", err, err)
			}
			got := err.Error()
			for line := range strings.SplitSeq(got, "\n") {
				if !strings.HasPrefix(line, f+":") {
					t.Errorf("error line does not name the file %s: %s", f, line)
				}
			}
			got = strings.ReplaceAll(got, f, name) + "\n"
			golden := strings.TrimSuffix(f, ".yaml") + ".golden"
			testkit.Golden(t, golden, []byte(got))
		})
	}
}

func TestSyntaxErrorHasLine(t *testing.T) {
	path := filepath.Join(invalidDir, "syntax.yaml")
	_, err := LoadWith(path, noEnv)
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.HasPrefix(err.Error(), path+":4: ") {
		t.Errorf("error %q should start with %s:4:", err, path)
	}
	var ve *ValidationError
	if errors.As(err, &ve) {
		t.Errorf("a syntax error is not a ValidationError: %v", err)
	}
	if _, err := LoadWith(filepath.Join(invalidDir, "does-not-exist.yaml"), noEnv); !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("missing file: err = %v, want os.ErrNotExist and not ErrInvalid", err)
	}
}

func TestValidationErrorType(t *testing.T) {
	c := Default()
	c.LogLevel = "loud"
	c.Workers.Concurrency = 0
	err := c.Validate()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Validate() = %T %v, want *ValidationError", err, err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Error("ValidationError does not match ErrInvalid")
	}
	if len(ve.Errors) != 2 {
		t.Fatalf("got %d errors, want 2: %v", len(ve.Errors), ve)
	}
	want := "log_level: must be one of debug|info|warn|error, got \"loud\"\nworkers.concurrency: must be between 1 and 100000, got 0"
	if ve.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", ve.Error(), want)
	}
	fe := FieldError{Path: "backends[1].base_url", Message: "must be an absolute http(s) URL"}
	if got := fe.Error(); got != "backends[1].base_url: must be an absolute http(s) URL" {
		t.Errorf("FieldError.Error() = %q", got)
	}
}

func TestErrorsSortedByPath(t *testing.T) {
	ve := &ValidationError{Errors: []FieldError{
		{"routes[0].model", "a"},
		{"backends[10].name", "b"},
		{"backends[2].name", "c"},
		{"backends[2].models[11]", "d"},
		{"backends[2].models[9]", "e"},
		{"backends", "f"},
		{"backends[2].name", "g"},
	}}
	want := strings.Join([]string{
		"backends: f",
		"backends[2].models[9]: e",
		"backends[2].models[11]: d",
		"backends[2].name: c",
		"backends[2].name: g",
		"backends[10].name: b",
		"routes[0].model: a",
	}, "\n")
	if got := ve.Error(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestValidEdgeCases(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"auto_window zero", func(c *Config) { c.Idempotency.AutoWindow = 0 }},
		{"hot_ttl 15m of 24h", func(c *Config) { c.Idempotency.HotTTL = Duration(15 * time.Minute) }},
		{"hot_ttl equal to ttl", func(c *Config) { c.Idempotency.HotTTL = c.Idempotency.TTL }},
		{"hot_ttl with partitions (a cold tier each)", func(c *Config) {
			c.Idempotency.HotTTL = Duration(15 * time.Minute)
			c.NATS.Partitions = 2
		}},
		{"lease exactly 3x renew_every", func(c *Config) {
			c.Idempotency.Lease = Duration(6 * time.Second)
			c.Idempotency.RenewEvery = Duration(2 * time.Second)
		}},
		{"minimum ttl and lease", func(c *Config) {
			c.Idempotency.TTL = Duration(time.Second)
			c.Idempotency.AutoWindow = Duration(999 * time.Millisecond)
			c.Idempotency.Lease = Duration(2 * time.Second)
			c.Idempotency.RenewEvery = Duration(500 * time.Millisecond)
		}},
		{"max_payload 1 MiB", func(c *Config) { c.NATS.MaxPayload = 1 << 20 }},
		{"max_payload 64 MiB", func(c *Config) { c.NATS.MaxPayload = 64 << 20 }},
		{"max_body_bytes 64 MiB", func(c *Config) { c.HTTP.MaxBodyBytes = 64 << 20 }},
		{"sync interval", func(c *Config) { c.NATS.Sync = "1s" }},
		{"replicas 1", func(c *Config) { c.NATS.Replicas = 1 }},
		{"replicas 3", func(c *Config) { c.NATS.Replicas = 3 }},
		{"replicas 5", func(c *Config) { c.NATS.Replicas = 5 }},
		{"ipv6 listen, port 0", func(c *Config) { c.Listen = "[::1]:0"; c.NATS.Listen = ":4222" }},
		{"external nats, no data_dir", func(c *Config) { c.NATS.URL = "tls://nats.example.com:4222"; c.DataDir = "" }},
		{"websocket nats", func(c *Config) { c.NATS.URL = "wss://nats.example.com" }},
		{"retry headers", func(c *Config) { c.Idempotency.RetryHeaders = []string{"X-Retry-Attempt", "x-stainless-retry-count"} }},
		{"concurrency bounds", func(c *Config) { c.Workers.Concurrency = 100000 }},
		{"mock knobs", func(c *Config) { c.Backends[0].Mock = MockKnobs{Tokens: 100000} }},
		{"openai without key, zero mock knobs", func(c *Config) {
			c.Backends = append(c.Backends, Backend{Name: "local_llm-1", Type: TypeOpenAI,
				BaseURL: "http://localhost:8000/v1", Models: []string{"*"}, Timeout: Duration(time.Second)})
		}},
		{"route to mock", func(c *Config) {
			c.Routes = []Route{{Model: "oncegate-mock", Backends: []string{"mock"}, Dedup: ptr(false)}}
		}},
		{"retired ledger secrets", func(c *Config) {
			c.Ledger.Secret = strings.Repeat("c", 32)
			c.Ledger.RetiredSecrets = []RetiredSecret{
				{Secret: strings.Repeat("a", 32), Until: Timestamp{time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}},
				{Secret: strings.Repeat("b", 32), Until: Timestamp{time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}},
			}
		}},
		{"tenant ids", func(c *Config) {
			c.Tenants = []Tenant{
				{ID: "Acme.Corp_1-x", APIKeysSHA256: []string{strings.Repeat("a", 64)}},
				{ID: "b", APIKeysSHA256: []string{strings.Repeat("0", 64), strings.Repeat("f", 64)}},
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(c)
			if err := c.Validate(); err != nil {
				t.Errorf("Validate() = %v", err)
			}
		})
	}
}

func TestApplyEnv(t *testing.T) {
	openaiBackend := Backend{Name: "openai", Type: TypeOpenAI, BaseURL: "https://api.openai.com/v1",
		APIKeyEnv: "OPENAI_API_KEY", Models: []string{"*"}, Timeout: Duration(120 * time.Second)}
	mockBackend := Default().Backends[0]

	tests := []struct {
		name   string
		env    map[string]string
		start  func() *Config // nil = Default
		expect func(*Config)  // applied to Default (or start) to get the expected config
	}{
		{name: "no env", env: nil, expect: func(*Config) {}},
		{
			name: "all ONCEGATE overrides",
			env: map[string]string{
				"ONCEGATE_LISTEN":        "0.0.0.0:9000",
				"ONCEGATE_DATA_DIR":      "/srv/oncegate",
				"ONCEGATE_NATS_URL":      "nats://n:4222",
				"ONCEGATE_LOG_LEVEL":     "debug",
				"ONCEGATE_ROLE":          "worker",
				"ONCEGATE_LEDGER_SECRET": strings.Repeat("s", 32),
			},
			expect: func(c *Config) {
				c.Listen, c.DataDir, c.NATS.URL, c.LogLevel, c.Role = "0.0.0.0:9000", "/srv/oncegate", "nats://n:4222", "debug", "worker"
				c.Ledger.Secret = strings.Repeat("s", 32)
			},
		},
		{
			name: "tenants from env, merged into the file's",
			env:  map[string]string{"ONCEGATE_TENANTS": "acme=" + strings.Repeat("a", 64) + ", " + strings.Repeat("b", 64) + " ; globex=" + strings.Repeat("c", 64)},
			start: func() *Config {
				c := Default()
				c.Tenants = []Tenant{{ID: "acme", APIKeysSHA256: []string{strings.Repeat("d", 64)}}}
				return c
			},
			expect: func(c *Config) {
				c.Tenants = []Tenant{
					{ID: "acme", APIKeysSHA256: []string{strings.Repeat("d", 64), strings.Repeat("a", 64), strings.Repeat("b", 64)}},
					{ID: "globex", APIKeysSHA256: []string{strings.Repeat("c", 64)}},
				}
			},
		},
		{
			name:   "empty values change nothing",
			env:    map[string]string{"ONCEGATE_LISTEN": "", "ONCEGATE_ROLE": ""},
			expect: func(*Config) {},
		},
		{
			name: "unrelated variables ignored",
			env:  map[string]string{"LISTEN": "x", "ONCEGATE_LISTEN_ADDR": "y", "ONCEGATE_NATS_SYNC": "1s"},
			expect: func(*Config) {
			},
		},
		{
			name: "openai base url and key add a backend",
			env:  map[string]string{"OPENAI_BASE_URL": "https://api.openai.com/v1", "OPENAI_API_KEY": "sk-test"},
			expect: func(c *Config) {
				c.Backends = []Backend{mockBackend, openaiBackend}
			},
		},
		{
			name:   "base url without key adds nothing",
			env:    map[string]string{"OPENAI_BASE_URL": "https://api.openai.com/v1"},
			expect: func(*Config) {},
		},
		{
			name:   "key without base url adds nothing",
			env:    map[string]string{"OPENAI_API_KEY": "sk-test"},
			expect: func(*Config) {},
		},
		{
			name: "existing openai backend is kept as is",
			env:  map[string]string{"OPENAI_BASE_URL": "https://other.example.com/v1", "OPENAI_API_KEY": "sk-test"},
			start: func() *Config {
				c := Default()
				c.Backends = append(c.Backends, Backend{Name: "vllm", Type: TypeOpenAI, BaseURL: "http://127.0.0.1:8000/v1",
					Models: []string{"llama"}, Timeout: Duration(time.Minute)})
				return c
			},
			expect: func(*Config) {},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := Default
			if tt.start != nil {
				start = tt.start
			}
			got, want := start(), start()
			got.ApplyEnv(envMap(tt.env))
			tt.expect(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate() after ApplyEnv = %v", err)
			}
		})
	}
}

func TestApplyEnvThenResolve(t *testing.T) {
	// Zero-config OpenAI: the mock keeps its model, everything else goes to
	// the env-defined backend.
	c := Default()
	c.ApplyEnv(envMap(map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "OPENAI_API_KEY": "x"}))
	if rt, ok := c.Resolve("gpt-4o"); !ok || !slices.Equal(rt.Backends, []string{"openai"}) {
		t.Errorf("Resolve(gpt-4o) = %+v, %v", rt, ok)
	}
	if rt, ok := c.Resolve(MockModel); !ok || !slices.Equal(rt.Backends, []string{"mock"}) {
		t.Errorf("Resolve(%s) = %+v, %v", MockModel, rt, ok)
	}
}

func resolveTestConfig() *Config {
	c := Default()
	c.Backends = []Backend{
		{Name: "mock", Type: TypeMock, Models: []string{"oncegate-mock", "oncegate-echo"}, Timeout: Duration(time.Minute), Mock: MockKnobs{Tokens: 1}},
		{Name: "vllm", Type: TypeOpenAI, BaseURL: "http://127.0.0.1:8000/v1", Models: []string{"llama", "gpt-4o-mini"}, Timeout: Duration(time.Minute)},
		{Name: "openai", Type: TypeOpenAI, BaseURL: "https://api.openai.com/v1", Models: []string{"gpt-4o-mini", "*"}, Timeout: Duration(time.Minute)},
		{Name: "azure", Type: TypeOpenAI, BaseURL: "https://x.openai.azure.com/v1", Models: []string{"*"}, Timeout: Duration(time.Minute)},
	}
	c.Routes = []Route{
		{Model: "llama", Backends: []string{"openai", "vllm"}},
		{Model: "o3", Backends: []string{"azure"}, Dedup: ptr(false)},
		{Model: "oncegate-echo", Backends: []string{"mock"}, Dedup: ptr(true)},
	}
	return c
}

func TestResolve(t *testing.T) {
	c := resolveTestConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		model string
		want  RouteTarget
		ok    bool
	}{
		{"explicit route wins over backend models", "llama", RouteTarget{"llama", []string{"openai", "vllm"}, true, nil}, true},
		{"explicit route dedup false", "o3", RouteTarget{"o3", []string{"azure"}, false, nil}, true},
		{"explicit route dedup true", "oncegate-echo", RouteTarget{"oncegate-echo", []string{"mock"}, true, nil}, true},
		{"exact model, first backend wins", "gpt-4o-mini", RouteTarget{"gpt-4o-mini", []string{"vllm"}, true, nil}, true},
		{"exact mock model", "oncegate-mock", RouteTarget{"oncegate-mock", []string{"mock"}, true, nil}, true},
		{"catch-all, first one wins", "claude-3", RouteTarget{"claude-3", []string{"openai"}, true, nil}, true},
		{"case matters", "LLAMA", RouteTarget{"LLAMA", []string{"openai"}, true, nil}, true},
		{"empty model", "", RouteTarget{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := c.Resolve(tt.model)
			if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Resolve(%q) = %+v, %v; want %+v, %v", tt.model, got, ok, tt.want, tt.ok)
			}
		})
	}

	// Without a catch-all, unknown models are unknown.
	d := Default()
	for _, m := range []string{"gpt-4o", "oncegate-other", "*"} {
		if got, ok := d.Resolve(m); ok {
			t.Errorf("Default().Resolve(%q) = %+v, want unknown", m, got)
		}
	}

	// The returned backends are a copy.
	rt, _ := c.Resolve("llama")
	rt.Backends[0] = "changed"
	if c.Routes[0].Backends[0] != "openai" {
		t.Error("Resolve returned the route's own slice")
	}
}

func TestModelNames(t *testing.T) {
	got := resolveTestConfig().ModelNames()
	want := []string{"gpt-4o-mini", "llama", "o3", "oncegate-echo", "oncegate-mock"}
	if !slices.Equal(got, want) {
		t.Errorf("ModelNames() = %q, want %q", got, want)
	}
	if got := Default().ModelNames(); !slices.Equal(got, []string{MockModel}) {
		t.Errorf("Default().ModelNames() = %q", got)
	}
}

func TestBackendLookup(t *testing.T) {
	c := resolveTestConfig()
	b, ok := c.Backend("vllm")
	if !ok || b.BaseURL != "http://127.0.0.1:8000/v1" {
		t.Errorf("Backend(vllm) = %+v, %v", b, ok)
	}
	if _, ok := c.Backend("nope"); ok {
		t.Error("Backend(nope) found")
	}
}

func TestDurationYAML(t *testing.T) {
	var v struct {
		A, B, C Duration
	}
	if err := yaml.Unmarshal([]byte("a: 150ms\nb: 1h2m3s\nc: 0\n"), &v); err != nil {
		t.Fatal(err)
	}
	if v.A.D() != 150*time.Millisecond || v.B.D() != time.Hour+2*time.Minute+3*time.Second || v.C != 0 {
		t.Errorf("decoded %+v", v)
	}
	out, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "a: 150ms\nb: 1h2m3s\nc: 0s\n" {
		t.Errorf("marshaled %q", out)
	}
	for _, bad := range []string{"a: 5\n", "a: five\n", "a: [1s]\n", "a: {x: 1}\n", "a: true\n"} {
		if err := yaml.Unmarshal([]byte(bad), &v); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Unmarshal(%q) error = %v, want one naming line 1", bad, err)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	rotated := Default()
	rotated.Ledger.Secret = strings.Repeat("c", 32)
	rotated.Ledger.RetiredSecrets = []RetiredSecret{{Secret: strings.Repeat("a", 32), Until: Timestamp{time.Date(2026, 11, 1, 12, 30, 0, 0, time.UTC)}}}
	for _, c := range []*Config{Default(), resolveTestConfig(), rotated} {
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
		out2, err := yaml.Marshal(back)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != string(out2) {
			t.Errorf("round trip changed the config:\n%s\n---\n%s", out, out2)
		}
	}
}

func FuzzLoadYAML(f *testing.F) {
	for _, pattern := range []string{"*.yaml", filepath.Join("invalid", "*.yaml")} {
		files, _ := filepath.Glob(filepath.Join(examplesDir, pattern))
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("idempotency: {lease: 3s, renew_every: 1s}\n"))
	f.Add([]byte("backends: [{name: a, type: openai, base_url: 'http://[::1]:80', models: ['*']}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if c != nil {
				t.Errorf("Parse returned a config and an error: %v", err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("Parse error does not match ErrInvalid: %v", err)
			}
			var ve *ValidationError
			if errors.As(err, &ve) && len(ve.Errors) == 0 {
				t.Error("empty ValidationError")
			}
			_ = err.Error()
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse succeeded but Validate() = %v", err)
		}
		// A valid config resolves each of its model names to a known backend.
		for _, m := range c.ModelNames() {
			rt, ok := c.Resolve(m)
			if !ok || len(rt.Backends) == 0 {
				t.Fatalf("Resolve(%q) = %+v, %v", m, rt, ok)
			}
			if _, ok := c.Backend(rt.Backends[0]); !ok {
				t.Fatalf("Resolve(%q) -> unknown backend %q", m, rt.Backends[0])
			}
		}
	})
}

// TestAliasExpansionIsBounded: merges of aliases that expand a small document into a billion
// values are refused by the walk that reports unknown fields, as yaml.v3 refuses to decode
// them, instead of walking every expanded value.
func TestAliasExpansionIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("x0: &m0 {ttl: 3s}\n")
	for i := 1; i <= 9; i++ {
		refs := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*m%d,", i-1), 10), ",")
		fmt.Fprintf(&b, "x%d: &m%d {<<: [%s]}\n", i, i, refs)
	}
	b.WriteString("idempotency: *m9\n")
	_, err := Parse([]byte(b.String()))
	var fe *FileError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "expands (through aliases)") {
		t.Fatalf("err = %v, want a FileError saying the document expands too far", err)
	}
}

// TestLimitsShare: a node's share is each cap divided by the API nodes, rounded down, so the
// nodes' shares never add up to more than the cap; the burst defaults to the rate rounded up
// before it is divided.
func TestLimitsShare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		l     Limits
		nodes int
		want  Limits
	}{
		{"one node keeps the caps", Limits{Executions: 5, RequestsPerSecond: 2.5}, 1, Limits{Executions: 5, RequestsPerSecond: 2.5}},
		{"three nodes, rounded down", Limits{Executions: 10, Streams: 8, FollowersPerJob: 3, TokensPerMinute: 1000},
			3, Limits{Executions: 3, Streams: 2, FollowersPerJob: 1, TokensPerMinute: 333}},
		{"burst from the rate", Limits{RequestsPerSecond: 7.5}, 2, Limits{RequestsPerSecond: 3.75, Burst: 4}},
		{"burst given", Limits{RequestsPerSecond: 10, Burst: 25}, 4, Limits{RequestsPerSecond: 2.5, Burst: 6}},
		{"no caps", Limits{}, 3, Limits{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.l.Share(tc.nodes)
			if got != tc.want {
				t.Fatalf("Share(%d) of %+v = %+v, want %+v", tc.nodes, tc.l, got, tc.want)
			}
			sum := func(n int) int { return n * tc.nodes }
			if sum(got.Executions) > tc.l.Executions || sum(got.Streams) > tc.l.Streams || sum(got.TokensPerMinute) > tc.l.TokensPerMinute ||
				got.RequestsPerSecond*float64(tc.nodes) > tc.l.RequestsPerSecond+1e-9 {
				t.Fatalf("the shares of %d nodes add up to more than the caps: %+v", tc.nodes, got)
			}
		})
	}
}

// TestChargeGrace: workers.charge_grace keeps its default when a workers section leaves it out,
// is read when set, and is refused under a second.
func TestChargeGrace(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
		err  string
	}{
		{yaml: "workers: {sweep_every: 1s}\n", want: 30 * time.Second},
		{yaml: "workers: {charge_grace: 5s}\n", want: 5 * time.Second},
		{yaml: "workers: {charge_grace: 500ms}\n", err: "workers.charge_grace: must be at least 1s, got 500ms"},
	} {
		c, err := Parse([]byte(tc.yaml))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: err %v, want %q", tc.yaml, err, tc.err)
			}
			continue
		}
		if err != nil || c.Workers.ChargeGrace.D() != tc.want {
			t.Errorf("%q: charge_grace %v (%v), want %s", tc.yaml, c.Workers.ChargeGrace, err, tc.want)
		}
	}
}
