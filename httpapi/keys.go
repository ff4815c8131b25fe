package httpapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxKeyLength is the longest Idempotency-Key accepted.
const MaxKeyLength = 255

var (
	errKeyEmpty     = errors.New("Idempotency-Key is empty")
	errKeyTooLong   = fmt.Errorf("Idempotency-Key is longer than %d characters", MaxKeyLength)
	errKeyCharset   = errors.New("Idempotency-Key must be printable ASCII")
	errKeyMalformed = errors.New("Idempotency-Key is a malformed structured-field string")
)

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

// hashParts is the record key for parts: hex of SHA-256, 128 bits, safe as a NATS subject
// token, KV key and message id. Client text never reaches NATS raw.
func hashParts(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// autoKeyPrefix marks a generated key (echoed to the client, usable in the status API).
const autoKeyPrefix = "auto-"

// recordKey maps a client's Idempotency-Key to its record key: a hash scoped by tenant, so
// no key of one tenant, however crafted, can reach another tenant's record.
func recordKey(tenant, key string) string {
	return hashParts(tenant, "key", key)
}

// lookupKey is the record key for the status API, where a generated key ("auto-<hash>", as
// echoed in Idempotency-Key) names its record directly; the caller checks the record's tenant.
func lookupKey(tenant, key string) string {
	if strings.HasPrefix(key, autoKeyPrefix) && isHex32(key[len(autoKeyPrefix):]) {
		return key[len(autoKeyPrefix):]
	}
	return recordKey(tenant, key)
}

func isHex32(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// transportFields are left out of the fingerprint: a streamed and a non-streamed copy of one
// intent are the same intent.
var transportFields = []string{"stream", "stream_options"}

// canonicalFingerprint is the SHA-256 (hex) of the body as canonical JSON: object keys sorted,
// insignificant whitespace removed, numbers kept as written, transport fields dropped. The
// body must be a JSON object.
func canonicalFingerprint(body []byte) (string, map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return "", nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", nil, errors.New("trailing data after the JSON object")
	}
	if obj == nil {
		return "", nil, errors.New("body must be a JSON object")
	}
	fp := make(map[string]any, len(obj))
	for k, v := range obj {
		fp[k] = v
	}
	for _, f := range transportFields {
		delete(fp, f)
	}
	canon, err := json.Marshal(fp) // encoding/json sorts map keys
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), obj, nil
}
