package httpapi

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/internal/jsonscan"
)

// MaxKeyLength is the longest Idempotency-Key accepted.
const MaxKeyLength = 255

var (
	errKeyEmpty     = errors.New("Idempotency-Key is empty")
	errKeyTooLong   = fmt.Errorf("Idempotency-Key is longer than %d characters", MaxKeyLength)
	errKeyCharset   = errors.New("Idempotency-Key must be printable ASCII")
	errKeyMalformed = errors.New("Idempotency-Key is a malformed structured-field string")
)

var errKeyRepeated = errors.New("Idempotency-Key is sent more than once with different values")

// idempotencyKeyHeader is the raw Idempotency-Key of the request, else its X-Idempotency-Key,
// copied; present reports that the header was sent at all. fasthttp's Get and Peek give ""
// for both an absent and an empty header, and an empty key must be refused (400), never taken
// for an absent one (an auto key). The same header repeated with different values is refused.
func idempotencyKeyHeader(c *fiber.Ctx) (raw string, present bool, err error) {
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		vals := c.Request().Header.PeekAll(name)
		if len(vals) == 0 {
			continue
		}
		for _, v := range vals[1:] {
			if !bytes.Equal(v, vals[0]) {
				return "", true, errKeyRepeated
			}
		}
		return string(vals[0]), true, nil
	}
	return "", false, nil
}

// parseIdempotencyKey accepts a bare key or an RFC 8941 sf-string ("…", with \" and \\
// escapes) and validates 1-255 printable ASCII characters (0x21-0x7E; spaces inside allowed).
func parseIdempotencyKey(raw string) (string, error) {
	v := strings.TrimSpace(raw)
	if len(v) >= 1 && v[0] == '"' {
		var b strings.Builder
		closed := false
		for i := 1; i < len(v); i++ {
			ch := v[i]
			if ch == '\\' {
				i++
				if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", errKeyMalformed
				}
				b.WriteByte(v[i])
				continue
			}
			if ch == '"' {
				if i != len(v)-1 {
					return "", errKeyMalformed
				}
				closed = true
				break
			}
			b.WriteByte(ch)
		}
		if !closed {
			return "", errKeyMalformed
		}
		v = b.String()
	}
	if v == "" {
		return "", errKeyEmpty
	}
	if len(v) > MaxKeyLength {
		return "", errKeyTooLong
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7E {
			return "", errKeyCharset
		}
	}
	return v, nil
}

// isTransportField reports the fields left out of the fingerprint ("stream",
// "stream_options"): a streamed and a non-streamed copy of one intent are the same intent.
func isTransportField(key string) bool { return key == "stream" || key == "stream_options" }

// canonicalFingerprint is the SHA-256 (hex) of the body as canonical JSON (jsonscan.Canonical,
// one pass): object keys sorted, insignificant whitespace removed, strings as encoding/json
// writes them, numbers in one spelling per value (0.5, 0.50 and 5e-1 are one intent; integers
// written as integers stay exact), transport fields dropped. The body must be a JSON object
// that every parser reads alike: a duplicate key (at any depth), invalid UTF-8, a lone
// surrogate escape or a number beyond float64 is an error that names the offset, never the
// body's bytes. fields are its top-level members.
//
// Changing these rules changes the fingerprint of some bodies, and a retry of a request
// stored before the change then meets its old record with another fingerprint (422): the
// number rule did so for bodies with numbers spelled otherwise than canonically (0.50, 1.0, 1e2).
func canonicalFingerprint(body []byte) (string, bodyFields, error) {
	return fingerprintOf(body, isTransportField)
}

// isResponsesTransportField: a Responses request's background flag is a transport field too
// (a background copy and a waiting copy of one intent share its execution).
func isResponsesTransportField(key string) bool { return isTransportField(key) || key == "background" }

// fingerprintOf is canonicalFingerprint with the transport fields transport names.
func fingerprintOf(body []byte, transport func(string) bool) (string, bodyFields, error) {
	sum, fields, err := jsonscan.CanonicalSum(body, transport)
	switch {
	case errors.Is(err, jsonscan.ErrNotObject):
		return "", nil, errors.New("body must be a JSON object")
	case err != nil:
		return "", nil, err
	}
	return hex.EncodeToString(sum[:]), fields, nil
}

// paramCheck is an API's own check of a top-level member of its request, for refusedBody: the
// answer it gives that value (nil: it has no check of name, or the value passes).
type paramCheck func(name string, value []byte) error

// refusedBody is the answer to body, which fingerprintOf refused with err: invalid_json. A
// number beyond float64's range that is a top-level member's value is instead answered as
// the API answers any other value of that member it refuses (check): a 5,000-digit
// max_tokens as a 20-digit one, naming max_tokens; a member the API does not check is
// invalid_json naming it.
func refusedBody(body []byte, err error, check paramCheck) error {
	var se *jsonscan.SyntaxError
	if !errors.As(err, &se) || !errors.Is(err, jsonscan.ErrNumberRange) || se.Offset >= len(body) {
		return invalidJSON(err)
	}
	members, oerr := jsonscan.Object(body) // encoding/json's rules: the number's range is no fault
	if oerr != nil {
		return invalidJSON(err)
	}
	for _, m := range members {
		if len(m.Value) == 0 || &m.Value[0] != &body[se.Offset] { // the number is this member's value
			continue
		}
		name := m.Name()
		if check != nil {
			if cerr := check(name, m.Value); cerr != nil {
				return cerr
			}
		}
		ae := invalidJSON(err)
		ae.Param = name
		return ae
	}
	return invalidJSON(err)
}

// bodyFields are a request body's top-level members (a body has no duplicate keys), raw.
type bodyFields map[string]json.RawMessage

// str is field k if it is a JSON string.
func (f bodyFields) str(k string) (string, bool) {
	raw := f[k]
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// model is the required "model" field: a non-empty string, else errNoModel.
func (f bodyFields) model() (string, error) {
	m, ok := f.str("model")
	if !ok || m == "" {
		return "", errNoModel
	}
	return m, nil
}

// number is field k if it is a JSON number, as written.
func (f bodyFields) number(k string) (json.Number, bool) {
	raw := f[k]
	if len(raw) == 0 || raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return "", false
	}
	return json.Number(raw), true
}

// nonEmptyArray reports whether field k is an array with at least one element.
func (f bodyFields) nonEmptyArray(k string) bool {
	raw := f[k]
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	rest := bytes.TrimLeft(raw[1:], " \t\r\n")
	return len(rest) > 0 && rest[0] != ']'
}

// object is field k decoded, if it is a JSON object.
func (f bodyFields) object(k string) (map[string]any, bool) {
	raw := f[k]
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	var m map[string]any
	return m, json.Unmarshal(raw, &m) == nil
}
