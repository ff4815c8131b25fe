// Package config loads, defaults, overrides from the environment and validates
// oncegate's YAML configuration.
//
// The life of a configuration is:
//
//  1. [Default] builds a complete, valid configuration: listen on
//     127.0.0.1:8080, embedded NATS in ./data, and a single built-in mock
//     backend serving the model "oncegate-mock".
//  2. [Load] (or [Parse]) decodes YAML over those defaults. Keys are snake_case,
//     durations are Go duration strings ("3s", "150ms") and unknown keys are
//     errors. A list given in YAML (backends, routes, tenants, ...) replaces the
//     default list; fields omitted from a backend entry get the backend
//     defaults (timeout 120s, mock tokens 16).
//  3. [Config.ApplyEnv] applies ONCEGATE_* overrides and the
//     OPENAI_BASE_URL/OPENAI_API_KEY convenience backend.
//  4. [Config.Validate] checks every rule and reports all problems at once as a
//     [*ValidationError], which matches [ErrInvalid] with errors.Is.
//
// [Config.Resolve] and [Config.ModelNames] turn the backends and routes into the
// routing table used by the HTTP API.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Backend types.
const (
	TypeOpenAI = "openai" // an OpenAI-compatible HTTP API (OpenAI, vLLM, llama.cpp, ...)
	TypeMock   = "mock"   // the built-in deterministic mock, for tests and demos
)

// The built-in mock backend present in [Default].
const (
	MockModel       = "oncegate-mock"
	MockBackendName = "mock"
)

// MockModelPrefix is the prefix every model served by a mock backend must
// carry: the mock never impersonates a real provider's model.
const MockModelPrefix = "oncegate-"

// CatchAll in a backend's models list makes it serve every model that no
// explicit route and no other backend serves by exact name.
const CatchAll = "*"

// Defaults that also apply to backend entries written in YAML.
const (
	DefaultBackendTimeout = 120 * time.Second
	DefaultMockTokens     = 16
)

// Config is oncegate's whole configuration.
type Config struct {
	Listen      string      `yaml:"listen"`    // HTTP listen address, host:port
	DataDir     string      `yaml:"data_dir"`  // embedded NATS store directory
	LogLevel    string      `yaml:"log_level"` // debug|info|warn|error
	Role        string      `yaml:"role"`      // all|api|worker
	NATS        NATS        `yaml:"nats"`
	HTTP        HTTP        `yaml:"http"`
	Workers     Workers     `yaml:"workers"`
	Idempotency Idempotency `yaml:"idempotency"`
	Backends    []Backend   `yaml:"backends"`
	Routes      []Route     `yaml:"routes"`
	Tenants     []Tenant    `yaml:"tenants"`
}

// NATS configures the connection to NATS, or the embedded server.
type NATS struct {
	URL        string `yaml:"url"`         // empty = start the embedded server; else nats://... external
	Listen     string `yaml:"listen"`      // embedded server client listener; empty = no network port
	Sync       string `yaml:"sync"`        // "always" or a duration like "1s" (embedded only)
	MaxPayload int32  `yaml:"max_payload"` // bytes
}

// HTTP configures the HTTP server.
type HTTP struct {
	MaxBodyBytes  int      `yaml:"max_body_bytes"`
	ReadTimeout   Duration `yaml:"read_timeout"`
	WriteTimeout  Duration `yaml:"write_timeout"` // not applied to SSE
	IdleTimeout   Duration `yaml:"idle_timeout"`
	ShutdownGrace Duration `yaml:"shutdown_grace"` // bounded wait for in-flight streams on SIGTERM
}

// Workers configures the worker side.
type Workers struct {
	Concurrency int `yaml:"concurrency"` // concurrent backend calls per worker process
	// SweepEvery is how often a worker looks for PENDING records whose lease ran out with no
	// job left to redeliver (e.g. after a NATS restart) and re-drives them.
	SweepEvery Duration `yaml:"sweep_every"`
}

// Idempotency configures deduplication.
type Idempotency struct {
	TTL        Duration `yaml:"ttl"`
	AutoWindow Duration `yaml:"auto_window"`
	MaxWait    Duration `yaml:"max_wait"`
	Lease      Duration `yaml:"lease"`
	RenewEvery Duration `yaml:"renew_every"`
	// RetryHeaders are extra header names whose presence (value != "" and
	// != "0") marks a request as a retry.
	RetryHeaders []string `yaml:"retry_headers"`
}

// Backend is an upstream LLM API.
type Backend struct {
	Name      string    `yaml:"name"`
	Type      string    `yaml:"type"` // TypeOpenAI | TypeMock
	BaseURL   string    `yaml:"base_url"`
	APIKeyEnv string    `yaml:"api_key_env"` // name of the env var holding the key (never the key itself)
	Models    []string  `yaml:"models"`      // CatchAll = models nobody else serves
	Timeout   Duration  `yaml:"timeout"`
	Mock      MockKnobs `yaml:"mock"` // only for TypeMock
}

// MockKnobs tune the mock backend.
type MockKnobs struct {
	TTFT       Duration `yaml:"ttft"`        // delay before the first token
	InterToken Duration `yaml:"inter_token"` // delay between tokens
	Tokens     int      `yaml:"tokens"`      // tokens per completion
}

// Route is an explicit route for one model; it overrides the backends' models
// lists.
type Route struct {
	Model    string   `yaml:"model"`
	Backends []string `yaml:"backends"` // ordered; only the first is used today
	Dedup    *bool    `yaml:"dedup"`    // nil = true; false = every request executes
}

// Tenant is a client of the gateway, authenticated by API key.
type Tenant struct {
	ID            string   `yaml:"id"`
	APIKeysSHA256 []string `yaml:"api_keys_sha256"` // hex sha256 of each API key
}

// backend has Backend's fields but no methods; it lets Backend.UnmarshalYAML
// decode with the default decoder (and its KnownFields setting) without
// recursing.
type backend Backend

// UnmarshalYAML decodes a backend entry, starting from the backend defaults
// (timeout 120s, mock tokens 16) so that omitted fields are not zero.
//
// It uses the callback form of yaml.Unmarshaler on purpose: unlike
// yaml.Node.Decode, the callback keeps the decoder's KnownFields setting.
func (b *Backend) UnmarshalYAML(unmarshal func(any) error) error {
	v := backend{
		Timeout: Duration(DefaultBackendTimeout),
		Mock:    MockKnobs{Tokens: DefaultMockTokens},
	}
	if err := unmarshal(&v); err != nil {
		return err
	}
	*b = Backend(v)
	return nil
}

// Duration is a time.Duration that YAML (un)marshals from/to Go duration
// strings such as "3s" or "150ms".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String returns the Go duration string, e.g. "1m30s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML encodes d as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML decodes a Go duration string. A bare 0 is accepted too.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		if v, err := time.ParseDuration(n.Value); err == nil {
			*d = Duration(v)
			return nil
		}
	}
	// A *yaml.TypeError lets the decoder carry on and report every bad value,
	// each with its line, like its own type errors.
	return &yaml.TypeError{Errors: []string{fmt.Sprintf(
		"line %d: cannot unmarshal %s into a duration (want a Go duration string like \"3s\" or \"150ms\")",
		n.Line, describeNode(n))}}
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return fmt.Sprintf("%s `%s`", n.ShortTag(), truncate(n.Value, 40))
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a value"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Default returns the default configuration. It is valid, and its only
// backend is the built-in mock serving [MockModel].
func Default() *Config {
	return &Config{
		Listen:   "127.0.0.1:8080",
		DataDir:  "./data",
		LogLevel: "info",
		Role:     "all",
		NATS: NATS{
			Sync:       "always",
			MaxPayload: 8 << 20,
		},
		HTTP: HTTP{
			MaxBodyBytes:  4 << 20,
			ReadTimeout:   Duration(30 * time.Second),
			WriteTimeout:  Duration(30 * time.Second),
			IdleTimeout:   Duration(120 * time.Second),
			ShutdownGrace: Duration(10 * time.Second),
		},
		Workers: Workers{Concurrency: 256, SweepEvery: Duration(time.Minute)},
		Idempotency: Idempotency{
			TTL:        Duration(24 * time.Hour),
			AutoWindow: Duration(3 * time.Second),
			MaxWait:    Duration(30 * time.Second),
			Lease:      Duration(15 * time.Second),
			RenewEvery: Duration(3 * time.Second),
		},
		Backends: []Backend{{
			Name:    MockBackendName,
			Type:    TypeMock,
			Models:  []string{MockModel},
			Timeout: Duration(DefaultBackendTimeout),
			Mock:    MockKnobs{Tokens: DefaultMockTokens},
		}},
	}
}

// Load reads the configuration: with path "" it starts from [Default],
// otherwise it decodes the YAML file over [Default] (unknown keys are
// errors). It then applies the environment ([Config.ApplyEnv] with os.Getenv)
// and validates.
//
// A YAML error is returned wrapped (with the file path and line number) and
// matches [ErrInvalid]; a validation failure is returned as a
// [*ValidationError] listing every problem.
func Load(path string) (*Config, error) {
	return LoadWith(path, os.Getenv)
}

// LoadWith is [Load] with the environment read through getenv.
func LoadWith(path string, getenv func(string) string) (*Config, error) {
	c := Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		c, err = decode(data)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, path, err)
		}
	}
	c.ApplyEnv(getenv)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Parse decodes YAML over [Default] and validates the result, exactly like
// [Load] but from bytes and without applying the environment.
func Parse(data []byte) (*Config, error) {
	c, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// decode decodes one YAML document over Default(). An empty document (or
// one holding only comments) yields the defaults.
func decode(data []byte) (*Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil {
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		return nil, err
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, err
	default:
		return nil, fmt.Errorf("yaml: line %d: only one YAML document is allowed", extra.Line)
	}
	return c, nil
}

// RouteTarget is where requests for a model go.
type RouteTarget struct {
	Model    string
	Backends []string // ordered; only the first is used today
	Dedup    bool
}

// Resolve returns the route for a model: an explicit route for the exact
// model wins; else the first backend whose models list contains the exact
// model; else the first backend whose models list contains [CatchAll].
// Dedup is true unless an explicit route disables it. ok is false for an
// unknown model.
func (c *Config) Resolve(model string) (RouteTarget, bool) {
	if model == "" {
		return RouteTarget{}, false
	}
	for _, r := range c.Routes {
		if r.Model == model {
			return RouteTarget{
				Model:    model,
				Backends: slices.Clone(r.Backends),
				Dedup:    r.Dedup == nil || *r.Dedup,
			}, true
		}
	}
	for _, b := range c.Backends {
		if slices.Contains(b.Models, model) {
			return RouteTarget{Model: model, Backends: []string{b.Name}, Dedup: true}, true
		}
	}
	for _, b := range c.Backends {
		if slices.Contains(b.Models, CatchAll) {
			return RouteTarget{Model: model, Backends: []string{b.Name}, Dedup: true}, true
		}
	}
	return RouteTarget{}, false
}

// ModelNames returns every exact (non-[CatchAll]) model name served by a
// backend or an explicit route, sorted and deduplicated.
func (c *Config) ModelNames() []string {
	var names []string
	for _, b := range c.Backends {
		for _, m := range b.Models {
			if m != CatchAll && m != "" {
				names = append(names, m)
			}
		}
	}
	for _, r := range c.Routes {
		if r.Model != CatchAll && r.Model != "" {
			names = append(names, r.Model)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Backend returns the backend with the given name.
func (c *Config) Backend(name string) (Backend, bool) {
	for _, b := range c.Backends {
		if b.Name == name {
			return b, true
		}
	}
	return Backend{}, false
}
