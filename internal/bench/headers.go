package bench

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/oncegate/oncegate/internal/config"
)

// ErrBadHeader is returned by [ParseHeader] (and [Config.Validate]) for a header that is not
// "Name: value" with a valid HTTP field name and value, or that the tool sets itself.
var ErrBadHeader = errors.New("bench: bad header")

// ownHeaders are set by the tool on every request (per scenario and intent) or by the HTTP
// client: a --header for one of them would contradict what is measured.
var ownHeaders = []string{"Idempotency-Key", "X-Stainless-Retry-Count", "Host", "Content-Length", "Transfer-Encoding"}

// ParseHeader parses one --header argument, "Name: value" (like curl -H). The name must be
// an HTTP token; the value may be empty but may not hold control characters (a CR or LF
// would split the request).
func ParseHeader(s string) (name, value string, err error) {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", fmt.Errorf("%w %q: want 'Name: value'", ErrBadHeader, s)
	}
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if err := checkHeader(name, value); err != nil {
		return "", "", err
	}
	return http.CanonicalHeaderKey(name), value, nil
}

func checkHeader(name, value string) error {
	if !config.IsHeaderName(name) {
		return fmt.Errorf("%w: name %q is not an HTTP field name (letters, digits and !#$%%&'*+-.^_`|~)", ErrBadHeader, name)
	}
	for _, own := range ownHeaders {
		if strings.EqualFold(name, own) {
			return fmt.Errorf("%w: %s is set by oncegate bench itself", ErrBadHeader, own)
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return fmt.Errorf("%w: %s: the value holds a control character (0x%02x)", ErrBadHeader, name, c)
		}
	}
	return nil
}

// requestHeader is what every request to a target carries besides the scenario's own
// headers: Config.Header, and Authorization from Config.APIKey.
func (c *Config) requestHeader() http.Header {
	h := c.Header.Clone()
	if c.APIKey != "" {
		if h == nil {
			h = http.Header{}
		}
		h.Set("Authorization", "Bearer "+c.APIKey)
	}
	return h
}

// ValidateHeaders reports the problems of Header and APIKey, wrapped in ErrBadHeader (and
// ErrConfig): a command line can refuse them as usage errors before anything runs.
func (c *Config) ValidateHeaders() error {
	var probs []string
	c.validateHeaders(func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) })
	if len(probs) > 0 {
		return fmt.Errorf("%w: %w: %s", ErrConfig, ErrBadHeader, strings.Join(probs, "; "))
	}
	return nil
}

func (c *Config) validateHeaders(bad func(string, ...any)) {
	for name, values := range c.Header {
		for _, v := range values {
			if err := checkHeader(name, v); err != nil {
				bad("--header: %v", err)
			}
		}
	}
	if c.APIKey != "" {
		if err := checkHeader("Authorization", c.APIKey); err != nil || strings.ContainsAny(c.APIKey, " \t") {
			bad("--api-key: must be one token without spaces or control characters")
		}
		if c.Header.Get("Authorization") != "" {
			bad("--api-key and --header 'Authorization: …' both set the Authorization header: give one")
		}
	}
}
