package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Environment variables read by [Config.ApplyEnv].
const (
	EnvListen   = "ONCEGATE_LISTEN"
	EnvDataDir  = "ONCEGATE_DATA_DIR"
	EnvNATSURL  = "ONCEGATE_NATS_URL"
	EnvLogLevel = "ONCEGATE_LOG_LEVEL"
	EnvRole     = "ONCEGATE_ROLE"
	// EnvLedgerSecret overrides ledger.secret (keeping the secret out of the file).
	EnvLedgerSecret = "ONCEGATE_LEDGER_SECRET"

	// EnvTenants adds tenants: "acme=<sha256 hex>,<sha256 hex>;globex=<sha256 hex>". A tenant
	// already in the file gets the keys added.
	EnvTenants = "ONCEGATE_TENANTS"

	// EnvOpenAIBaseURL and EnvOpenAIAPIKey, both set, add a backend named "openai" of type
	// openai serving every model no other backend serves ("*") at EnvOpenAIBaseURL with the
	// key in EnvOpenAIAPIKey, unless a backend of type openai is configured.
	EnvOpenAIBaseURL = "OPENAI_BASE_URL"
	EnvOpenAIAPIKey  = "OPENAI_API_KEY" // #nosec G101 -- the name of the variable that holds the key, not a key
)

// ErrEnvIncomplete is returned by [LoadWith] (and [Load]) when OPENAI_BASE_URL is set
// without OPENAI_API_KEY while the configuration has no backend of type openai, so the
// variable would add the convenience backend: without its key that backend cannot work, and
// ignoring the variable would leave every request on the mock. The error names the missing
// variable. The reverse (OPENAI_API_KEY alone) is not an error: many shells export it for
// other tools, and a backends: entry may name it as its api_key_env.
var ErrEnvIncomplete = errors.New("config: incomplete environment")

// checkEnv returns an [ErrEnvIncomplete] error naming the missing variable, or nil.
func (c *Config) checkEnv(getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	if getenv(EnvOpenAIBaseURL) == "" || getenv(EnvOpenAIAPIKey) != "" ||
		slices.ContainsFunc(c.Backends, func(b Backend) bool { return b.Type == TypeOpenAI }) {
		return nil
	}
	return fmt.Errorf("%w: %s is set but %s is not: set %s too (the backend at %s needs its key), or unset %s",
		ErrEnvIncomplete, EnvOpenAIBaseURL, EnvOpenAIAPIKey, EnvOpenAIAPIKey, EnvOpenAIBaseURL, EnvOpenAIBaseURL)
}

// ApplyEnv applies environment overrides; an unset or empty variable changes
// nothing. getenv is usually os.Getenv (nil means os.Getenv).
//
//   - ONCEGATE_LISTEN, ONCEGATE_DATA_DIR, ONCEGATE_NATS_URL,
//     ONCEGATE_LOG_LEVEL, ONCEGATE_ROLE and ONCEGATE_LEDGER_SECRET override listen,
//     data_dir, nats.url, log_level, role and ledger.secret.
//   - If OPENAI_BASE_URL and OPENAI_API_KEY are both set and no backend of
//     type openai exists, a backend named "openai" is appended that serves
//     every model ("*") at $OPENAI_BASE_URL with the key from
//     $OPENAI_API_KEY (only the variable's name is stored).
//
// ApplyEnv does not validate; call [Config.Validate] afterwards.
func (c *Config) ApplyEnv(getenv func(string) string) {
	if getenv == nil {
		getenv = os.Getenv
	}
	for _, o := range []struct {
		env string
		dst *string
	}{
		{EnvListen, &c.Listen},
		{EnvDataDir, &c.DataDir},
		{EnvNATSURL, &c.NATS.URL},
		{EnvLogLevel, &c.LogLevel},
		{EnvRole, &c.Role},
		{EnvLedgerSecret, &c.Ledger.Secret},
	} {
		if v := getenv(o.env); v != "" {
			*o.dst = v
		}
	}

	c.applyTenantsEnv(getenv(EnvTenants))

	baseURL := getenv(EnvOpenAIBaseURL)
	if baseURL == "" || getenv(EnvOpenAIAPIKey) == "" {
		return
	}
	if slices.ContainsFunc(c.Backends, func(b Backend) bool { return b.Type == TypeOpenAI }) {
		return
	}
	c.Backends = append(c.Backends, Backend{
		Name:      "openai",
		Type:      TypeOpenAI,
		BaseURL:   baseURL,
		APIKeyEnv: EnvOpenAIAPIKey,
		Models:    []string{CatchAll},
		Timeout:   Duration(DefaultBackendTimeout),
	})
}

// applyTenantsEnv merges ONCEGATE_TENANTS into c.Tenants; malformed parts are kept as written
// so Validate reports them (an empty id, a bad hash).
func (c *Config) applyTenantsEnv(v string) {
	if strings.TrimSpace(v) == "" {
		return
	}
	for _, part := range strings.Split(v, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, keys, _ := strings.Cut(part, "=")
		id = strings.TrimSpace(id)
		var hashes []string
		for _, k := range strings.Split(keys, ",") {
			if k = strings.TrimSpace(k); k != "" {
				hashes = append(hashes, k)
			}
		}
		i := slices.IndexFunc(c.Tenants, func(t Tenant) bool { return t.ID == id })
		if i < 0 {
			c.Tenants = append(c.Tenants, Tenant{ID: id})
			i = len(c.Tenants) - 1
		}
		c.Tenants[i].APIKeysSHA256 = append(c.Tenants[i].APIKeysSHA256, hashes...)
	}
}
