package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// rawRequest writes req byte for byte on a new connection to addr (host:port) and reads one
// response. It reaches header bytes that net/http refuses to send (control characters).
func rawRequest(t testing.TB, addr, req string) result {
	t.Helper()
	return parseRaw(t, rawExchange(t, addr, req))
}

// parseRaw parses all as one HTTP response and reads its body.
func parseRaw(t testing.TB, all []byte) result {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(all)), nil)
	if err != nil {
		t.Fatalf("read response: %v\n%s", err, all)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return result{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// rawChat is a raw HTTP/1.1 POST of body to the chat endpoint with one extra header line.
func rawChat(addr, headerLine, body string) string {
	return "POST " + chatPath + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		headerLine + "\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\nConnection: close\r\n\r\n" + body
}

// TestBadInput: every malformed request gets a clear 4xx in the OpenAI error format and
// creates no job (invariant 3: bad input changes no state).
func TestBadInput(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.HTTP.MaxBodyBytes = 64 << 10
	gw := gatewaykit.StartGateway(t, cfg)
	addr := strings.TrimPrefix(gw.URL, "http://")
	valid := chatBody("oncegate-mock", "bad input", "")
	big := chatBody("oncegate-mock", strings.Repeat("x", 65<<10), "")

	type tc struct {
		name   string
		method string
		path   string
		ctype  string
		body   string
		hdr    map[string]string
		raw    string // when set, sent byte for byte instead
		status int
		code   string // "" = any non-empty
	}
	key := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }
	cases := []tc{
		{name: "malformed JSON", body: `{"model":"oncegate-mock","messages":[`, status: 400, code: "invalid_json"},
		{name: "not JSON at all", body: `hello`, status: 400, code: "invalid_json"},
		{name: "empty body", body: ``, status: 400, code: "invalid_json"},
		{name: "JSON null", body: `null`, status: 400, code: "invalid_json"},
		{name: "JSON array instead of object", body: `[` + valid + `]`, status: 400, code: "invalid_json"},
		{name: "JSON string instead of object", body: `"hi"`, status: 400, code: "invalid_json"},
		{name: "trailing garbage", body: valid + ` xyz`, status: 400, code: "invalid_json"},
		{name: "trailing second object", body: valid + valid, status: 400, code: "invalid_json"},
		{name: "trailing close brace", body: valid + `}`, status: 400, code: "invalid_json"},
		{name: "trailing close bracket", body: valid + `]`, status: 400, code: "invalid_json"},
		{name: "missing model", body: `{"messages":[{"role":"user","content":"hi"}]}`, status: 400, code: "missing_required_parameter"},
		{name: "model not a string", body: `{"model":7,"messages":[{"role":"user","content":"hi"}]}`, status: 400},
		{name: "empty model", body: `{"model":"","messages":[{"role":"user","content":"hi"}]}`, status: 400},
		{name: "missing messages", body: `{"model":"oncegate-mock"}`, status: 400, code: "missing_required_parameter"},
		{name: "empty messages", body: `{"model":"oncegate-mock","messages":[]}`, status: 400, code: "missing_required_parameter"},
		{name: "messages not an array", body: `{"model":"oncegate-mock","messages":"hi"}`, status: 400},
		{name: "stream is a string", body: chatBody("oncegate-mock", "s", `"stream":"true"`), status: 400, code: "invalid_type"},
		{name: "stream is a number", body: chatBody("oncegate-mock", "s", `"stream":1`), status: 400, code: "invalid_type"},
		{name: "unknown model", body: chatBody("gpt-nonexistent", "hi", ""), status: 404, code: "model_not_found"},
		// What JSON parsers read differently is refused, as the providers refuse it: the
		// fingerprint and the backend must read one request.
		{name: "invalid UTF-8 in a string", body: chatBody("oncegate-mock", "x", `"user":"ab`+"\xff"+`"`), status: 400, code: "invalid_json"},
		{name: "invalid UTF-8 in a key", body: chatBody("oncegate-mock", "x", `"us`+"\xc3"+`":1`), status: 400, code: "invalid_json"},
		{name: "lone surrogate escape", body: chatBody("oncegate-mock", "x", `"user":"\ud83d"`), status: 400, code: "invalid_json"},
		{name: "duplicate top-level key", body: `{"model":"gpt-nonexistent","model":"oncegate-mock","messages":[{"role":"user","content":"hi"}]}`, status: 400, code: "invalid_json"},
		{name: "duplicate nested key", body: `{"model":"oncegate-mock","messages":[{"role":"user","content":"a","content":"b"}]}`, status: 400, code: "invalid_json"},
		{name: "duplicate key, one escaped", body: `{"model":"oncegate-mock","messages":[{"role":"user","content":"hi"}],"stream":false,"\u0073tream":true}`, status: 400, code: "invalid_json"},
		{name: "number beyond float64", body: chatBody("oncegate-mock", "x", `"temperature":1e999`), status: 400, code: "invalid_json"},
		{name: "5000-digit max_tokens", body: chatBody("oncegate-mock", "x", `"max_tokens":`+strings.Repeat("7", 5000)), status: 400, code: "integer_above_max_value"},
		{name: "max_tokens zero", body: chatBody("oncegate-mock", "x", `"max_tokens":0`), status: 400, code: "integer_below_min_value"},
		{name: "max_tokens negative", body: chatBody("oncegate-mock", "x", `"max_tokens":-1`), status: 400, code: "integer_below_min_value"},
		{name: "max_tokens 2^31", body: chatBody("oncegate-mock", "x", `"max_tokens":2147483648`), status: 400, code: "integer_above_max_value"},
		{name: "max_tokens 2^63", body: chatBody("oncegate-mock", "x", `"max_tokens":9223372036854775808`), status: 400, code: "integer_above_max_value"},
		{name: "max_tokens a fraction", body: chatBody("oncegate-mock", "x", `"max_tokens":1.5`), status: 400, code: "invalid_type"},
		{name: "max_tokens a string", body: chatBody("oncegate-mock", "x", `"max_tokens":"16"`), status: 400, code: "invalid_type"},
		{name: "max_completion_tokens zero", body: chatBody("oncegate-mock", "x", `"max_completion_tokens":0`), status: 400, code: "integer_below_min_value"},
		{name: "max_completion_tokens with an exponent", body: chatBody("oncegate-mock", "x", `"max_completion_tokens":1e3`), status: 400, code: "invalid_type"},
		// Only the headers are sent: the gateway refuses from the Content-Length, without
		// reading the body, and closes the connection. A client still writing the body then can
		// get a reset before it reads the 413 (seen once in CI), which is not what is tested.
		{name: "body over the limit", raw: strings.TrimSuffix(rawChat(addr, "X-Test: over-limit", big), big), status: 413},
		// An encoded body is decoded up to the same limit: a small gzip of a large prompt is
		// refused when it grows past it (Fiber's own decoding has no bound).
		{name: "gzip growing past the limit", body: gzipped(big), hdr: map[string]string{"Content-Encoding": "gzip"}, status: 413, code: "request_too_large"},
		{name: "deflate growing past the limit", body: zlibbed(big), hdr: map[string]string{"Content-Encoding": "deflate"}, status: 413, code: "request_too_large"},
		{name: "gzip header on a plain body", body: valid, hdr: map[string]string{"Content-Encoding": "gzip"}, status: 400, code: "invalid_content_encoding"},
		{name: "truncated gzip", body: gzipped(valid)[:40], hdr: map[string]string{"Content-Encoding": "gzip"}, status: 400, code: "invalid_content_encoding"},
		{name: "brotli", body: valid, hdr: map[string]string{"Content-Encoding": "br"}, status: 415, code: "unsupported_content_encoding"},
		{name: "two encodings", body: gzipped(gzipped(valid)), hdr: map[string]string{"Content-Encoding": "gzip, gzip"}, status: 415, code: "unsupported_content_encoding"},
		{name: "GET on chat completions", method: http.MethodGet, body: "", status: 405},
		{name: "PUT on chat completions", method: http.MethodPut, body: valid, status: 405},
		{name: "DELETE on chat completions", method: http.MethodDelete, body: "", status: 405},
		{name: "text/plain content type", ctype: "text/plain", body: valid, status: 415},
		{name: "form content type", ctype: "application/x-www-form-urlencoded", body: valid, status: 415},
		{name: "missing content type", ctype: "-", body: valid, status: 415},
		{name: "unknown path", path: "/v1/chat/completion", body: valid, status: 404},
		{name: "unknown version path", path: "/v2/chat/completions", body: valid, status: 404},
		{name: "key empty quoted", body: valid, hdr: key(`""`), status: 400, code: "invalid_idempotency_key"},
		{name: "key 256 chars", body: valid, hdr: key(strings.Repeat("k", 256)), status: 400, code: "invalid_idempotency_key"},
		{name: "key quoted 256 chars", body: valid, hdr: key(`"` + strings.Repeat("k", 256) + `"`), status: 400, code: "invalid_idempotency_key"},
		{name: "key with tab", body: valid, hdr: key("ab\tcd"), status: 400, code: "invalid_idempotency_key"},
		{name: "key with non-ASCII byte", body: valid, hdr: key("ab\xe9cd"), status: 400, code: "invalid_idempotency_key"},
		{name: "key with UTF-8", body: valid, hdr: key("clé-1"), status: 400, code: "invalid_idempotency_key"},
		{name: "key unterminated quote", body: valid, hdr: key(`"abc`), status: 400, code: "invalid_idempotency_key"},
		{name: "key text after closing quote", body: valid, hdr: key(`"abc"def`), status: 400, code: "invalid_idempotency_key"},
		{name: "key bad escape", body: valid, hdr: key(`"a\nb"`), status: 400, code: "invalid_idempotency_key"},
		{name: "X-Idempotency-Key malformed", body: valid, hdr: map[string]string{"X-Idempotency-Key": `"abc`}, status: 400, code: "invalid_idempotency_key"},
		{name: "key with control char 0x01 (raw)", raw: rawChat(addr, "Idempotency-Key: ab\x01cd", valid), status: 400, code: "invalid_idempotency_key"},
		{name: "key with DEL (raw)", raw: rawChat(addr, "Idempotency-Key: ab\x7fcd", valid), status: 400, code: "invalid_idempotency_key"},
		// An empty header is a malformed key, not an absent one (which would get an auto key).
		{name: "key empty (raw)", raw: rawChat(addr, "Idempotency-Key:", valid), status: 400, code: "invalid_idempotency_key"},
		{name: "key empty after a space (raw)", raw: rawChat(addr, "Idempotency-Key: ", valid), status: 400, code: "invalid_idempotency_key"},
		{name: "X-Idempotency-Key empty (raw)", raw: rawChat(addr, "X-Idempotency-Key:", valid), status: 400, code: "invalid_idempotency_key"},
		{name: "key empty, X-Idempotency-Key valid (raw)", raw: rawChat(addr, "Idempotency-Key:\r\nX-Idempotency-Key: k1", valid), status: 400, code: "invalid_idempotency_key"},
		{name: "key repeated with two values (raw)", raw: rawChat(addr, "Idempotency-Key: k1\r\nIdempotency-Key: k2", valid), status: 400, code: "invalid_idempotency_key"},
		// X-Allow-Duplicate skips deduplication, not the validation of a key the client sent.
		{name: "allow duplicate, key empty (raw)", raw: rawChat(addr, "X-Allow-Duplicate: true\r\nIdempotency-Key:", valid), status: 400, code: "invalid_idempotency_key"},
		{name: "allow duplicate, key malformed", body: valid, hdr: map[string]string{"X-Allow-Duplicate": "true", "Idempotency-Key": `"abc`}, status: 400, code: "invalid_idempotency_key"},
	}
	mock := gw.Mock(t, "mock")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := mock.Stats().Requests
			var resp result
			if c.raw != "" {
				resp = rawRequest(t, addr, c.raw)
			} else {
				method, path, ctype := c.method, c.path, c.ctype
				if method == "" {
					method = http.MethodPost
				}
				if path == "" {
					path = chatPath
				}
				switch ctype {
				case "":
					ctype = "application/json"
				case "-":
					ctype = ""
				}
				hdr := map[string]string{"Content-Type": ctype}
				for k, v := range c.hdr {
					hdr[k] = v
				}
				resp = do(t, method, gw.URL+path, c.body, hdr)
			}
			if resp.Status != c.status {
				t.Errorf("status = %d, want %d; body %s", resp.Status, c.status, resp.Body)
			}
			assertOpenAIError(t, resp, c.code)
			for _, h := range []string{"Oncegate-Job-Id", "Oncegate-Idempotency", "Idempotent-Replayed"} {
				if v := resp.Header.Get(h); v != "" {
					t.Errorf("a rejected request carries %s: %q", h, v)
				}
			}
			if after := mock.Stats().Requests; after != before {
				t.Errorf("backend executions went %d -> %d: a rejected request created a job", before, after)
			}
		})
	}

	// A job queued by a bad request would have run by the time a valid one has: the count
	// after one valid request must be exactly one more.
	before := mock.Stats().Requests
	resp := postChat(t, gw.URL, chatBody("oncegate-mock", "bad input sentinel", ""), nil)
	b := resp.Body
	if resp.Status != http.StatusOK {
		t.Fatalf("sentinel: status %d body %s", resp.Status, b)
	}
	if got := mock.Stats().Requests - before; got != 1 {
		t.Fatalf("sentinel request: %d backend executions, want 1 (a rejected request queued a job)", got)
	}
}

// TestBadInputKeyNotStored: a request rejected for a malformed key leaves nothing behind; the
// same body with a valid key is then a fresh intent ("created") and runs once.
func TestBadInputKeyNotStored(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	body := chatBody("oncegate-mock", "key not stored", "")
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": `"unterminated`})
	b := resp.Body
	if resp.Status != http.StatusBadRequest {
		t.Fatalf("status %d body %s", resp.Status, b)
	}
	if got := resp.Header.Get("x-should-retry"); got != "false" {
		t.Errorf("x-should-retry = %q on a malformed key, want false", got)
	}
	resp = postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "unterminated"})
	b = resp.Body
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d body %s", resp.Status, b)
	}
	if got := resp.Header.Get("Oncegate-Idempotency"); got != "created" {
		t.Errorf("Oncegate-Idempotency = %q, want created", got)
	}
	if n := mock.Stats().Requests; n != 1 {
		t.Errorf("backend executions = %d, want 1", n)
	}
}

// TestBadInputErrorsQuoteNoBody: the reason a body is refused names the problem and where it
// is, never the body's bytes (a 5,000-digit number, a prompt, a key).
func TestBadInputErrorsQuoteNoBody(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	const marker = "og-body-marker"
	for name, body := range map[string]string{
		"duplicate key":   `{"model":"oncegate-mock","messages":[{"role":"user","content":"hi"}],"` + marker + `":1,"` + marker + `":2}`,
		"invalid UTF-8":   chatBody("oncegate-mock", marker, `"user":"`+marker+"\xff\""),
		"huge max_tokens": chatBody("oncegate-mock", marker, `"max_tokens":`+strings.Repeat("9", 40)),
	} {
		t.Run(name, func(t *testing.T) {
			resp := postChat(t, gw.URL, body, nil)
			b := resp.Body
			if resp.Status != http.StatusBadRequest {
				t.Fatalf("status %d body %s", resp.Status, b)
			}
			if strings.Contains(string(b), marker) || strings.Contains(string(b), "999") {
				t.Errorf("the error quotes the body: %s", b)
			}
			if !strings.Contains(string(b), "offset") && !strings.Contains(string(b), "max_tokens") {
				t.Errorf("the error says neither where nor which parameter: %s", b)
			}
		})
	}
}

// TestAnthropicTokenLimit: on /v1/messages max_tokens is required and bounded, refused in
// Anthropic's error format.
func TestAnthropicTokenLimit(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	msg := func(extra string) string {
		b := `{"model":"oncegate-mock","messages":[{"role":"user","content":"hi"}]`
		if extra != "" {
			b += "," + extra
		}
		return b + "}"
	}
	for _, c := range []struct {
		name, body string
		status     int
	}{
		{"absent", msg(""), 400},
		{"null", msg(`"max_tokens":null`), 400},
		{"zero", msg(`"max_tokens":0`), 400},
		{"2^31", msg(`"max_tokens":2147483648`), 400},
		{"5000 digits", msg(`"max_tokens":` + strings.Repeat("1", 5000)), 400},
		{"a fraction", msg(`"max_tokens":8.5`), 400},
		{"valid", msg(`"max_tokens":8`), 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := mock.Stats().Requests
			resp := do(t, http.MethodPost, gw.URL+"/v1/messages", c.body, nil)
			b := resp.Body
			if resp.Status != c.status {
				t.Fatalf("status %d, want %d; body %s", resp.Status, c.status, b)
			}
			if c.status == http.StatusOK {
				return
			}
			if !isAnthropicInvalid(b) {
				t.Errorf("not an Anthropic invalid_request_error: %s", b)
			}
			if after := mock.Stats().Requests; after != before {
				t.Errorf("backend executions went %d -> %d", before, after)
			}
		})
	}
}

// TestBypassEchoesKey: with X-Allow-Duplicate, a client's valid Idempotency-Key is echoed as
// sent (not replaced by a generated one), and each copy still executes on its own.
func TestBypassEchoesKey(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	body := chatBody("oncegate-mock", "bypass with a key", "")
	hdr := map[string]string{"X-Allow-Duplicate": "true", "Idempotency-Key": `"bp-1"`}
	jobIDs := map[string]bool{}
	for i := range 2 {
		resp := postChat(t, gw.URL, body, hdr)
		b := resp.Body
		if resp.Status != http.StatusOK {
			t.Fatalf("copy %d: status %d body %s", i, resp.Status, b)
		}
		if got := resp.Header.Get("Idempotency-Key"); got != "bp-1" {
			t.Errorf("copy %d: Idempotency-Key = %q, want the client's bp-1", i, got)
		}
		if got := resp.Header.Get("Oncegate-Idempotency"); got != "bypassed" {
			t.Errorf("copy %d: Oncegate-Idempotency = %q, want bypassed", i, got)
		}
		jobIDs[resp.Header.Get("Oncegate-Job-Id")] = true
	}
	if len(jobIDs) != 2 {
		t.Errorf("job ids %v: want two executions", jobIDs)
	}
	if n := mock.Stats().Requests; n != 2 {
		t.Errorf("backend executions = %d, want 2", n)
	}
}

// TestTenantAuth: with tenants configured, the chat endpoint and the model list need a valid
// API key (Authorization: Bearer or x-api-key); a refused caller creates no job.
func TestTenantAuth(t *testing.T) {
	sum := sha256.Sum256([]byte("sk-acme"))
	cfg := gatewaykit.Config(t)
	cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{hex.EncodeToString(sum[:])}}}
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "mock")

	cases := []struct {
		name   string
		hdr    map[string]string
		status int
		code   string
	}{
		{name: "no key", status: 401, code: "missing_api_key"},
		{name: "wrong bearer key", hdr: map[string]string{"Authorization": "Bearer sk-other"}, status: 401, code: "invalid_api_key"},
		{name: "wrong x-api-key", hdr: map[string]string{"x-api-key": "sk-other"}, status: 401, code: "invalid_api_key"},
		{name: "key as basic auth", hdr: map[string]string{"Authorization": "Basic c2stYWNtZQ=="}, status: 401},
		{name: "bearer with empty key", hdr: map[string]string{"Authorization": "Bearer "}, status: 401},
		{name: "key with a prefix of the real key", hdr: map[string]string{"Authorization": "Bearer sk-acm"}, status: 401, code: "invalid_api_key"},
		{name: "bearer key", hdr: map[string]string{"Authorization": "Bearer sk-acme"}, status: 200},
		{name: "lower-case bearer", hdr: map[string]string{"Authorization": "bearer sk-acme"}, status: 200},
		{name: "x-api-key", hdr: map[string]string{"x-api-key": "sk-acme"}, status: 200},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := mock.Stats().Requests
			// a distinct message per case: each accepted case is a new intent
			resp := postChat(t, gw.URL, chatBody("oncegate-mock", fmt.Sprintf("tenant case %d", i), ""), c.hdr)
			b := resp.Body
			if resp.Status != c.status {
				t.Fatalf("chat: status = %d, want %d; body %s", resp.Status, c.status, b)
			}
			mresp := do(t, http.MethodGet, gw.URL+"/v1/models", "", c.hdr)
			mb := mresp.Body
			if mresp.Status != c.status {
				t.Errorf("models: status = %d, want %d; body %s", mresp.Status, c.status, mb)
			}
			after := mock.Stats().Requests
			if c.status != http.StatusOK {
				assertOpenAIError(t, resp, c.code)
				assertOpenAIError(t, mresp, c.code)
				if after != before {
					t.Errorf("backend executions went %d -> %d on a refused caller", before, after)
				}
				return
			}
			parseCompletion(t, b)
			if after != before+1 {
				t.Errorf("backend executions went %d -> %d, want +1", before, after)
			}
		})
	}
}

// TestMalformedHTTP: a request fasthttp cannot parse gets a fixed OpenAI-format 4xx that
// echoes none of its bytes (its header block held the caller's API key), and creates no job.
func TestMalformedHTTP(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	addr := strings.TrimPrefix(gw.URL, "http://")
	const secret = "sk-og-secret-4f2a9c"
	const marker = "og-marker-77e1"
	body := chatBody("oncegate-mock", "malformed http", "")
	// req is a chat request whose header block holds bad (a raw header line, maybe broken).
	req := func(bad string) string {
		return "POST " + chatPath + " HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + secret + "\r\n" +
			bad + "\r\nContent-Type: application/json\r\nX-Marker: " + marker + "\r\nContent-Length: " +
			fmt.Sprint(len(body)) + "\r\nConnection: close\r\n\r\n" + body
	}
	cases := []struct {
		name   string
		raw    string
		status int
		code   string
	}{
		// A bare LF inside a value splits it: the rest is a line with no colon.
		{name: "bare LF inside the key's value", raw: strings.Replace(req("X-A: 1"), secret+"\r\n", secret+"\nrest\r\n", 1), status: 400, code: "malformed_request"},
		{name: "bare LF inside a later value", raw: req("X-A: a\nb"), status: 400, code: "malformed_request"},
		{name: "bare CR", raw: req("X-A: a\rb"), status: 400, code: "malformed_request"},
		{name: "header too large", raw: req("X-Big: " + strings.Repeat("b", 16<<10)), status: 431, code: "request_header_too_large"},
		{name: "space in a header name", raw: req("X A: 1"), status: 400, code: "malformed_request"},
		{name: "header line without a colon", raw: req("X-A"), status: 400, code: "malformed_request"},
		{name: "control byte in a header name", raw: req("X\x01A: 1"), status: 400, code: "malformed_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := mock.Stats().Requests
			all := rawExchange(t, addr, c.raw)
			for _, leak := range []string{secret, "Bearer", marker, "X-Marker", "Authorization", chatPath, "oncegate-mock", "malformed http"} {
				if strings.Contains(string(all), leak) {
					t.Errorf("the response echoes request bytes (%q):\n%s", leak, all)
				}
			}
			resp := parseRaw(t, all)
			b := resp.Body
			if resp.Status != c.status {
				t.Errorf("status = %d, want %d; body %s", resp.Status, c.status, b)
			}
			assertOpenAIError(t, resp, c.code)
			if after := mock.Stats().Requests; after != before {
				t.Errorf("backend executions went %d -> %d", before, after)
			}
		})
	}
}

// TestBareLFInHeader (issue 34): a request with a bare LF anywhere in its header section, with
// or without an Authorization header (ignored without tenants, a valid key with them), is
// refused with 400 malformed_request in its route's error format, and changes nothing: no
// backend call, no record under its Idempotency-Key. fasthttp reads a bare LF as a line end,
// so on main a value split by one ("X-A: a\nX-B: b"), a folded line after one, LF-only lines
// and an LF-ended header block were all executed. The same request with CRLF runs once.
func TestBareLFInHeader(t *testing.T) {
	const secret = "sk-og-lf-3d9e1b"
	sum := sha256.Sum256([]byte(secret))
	open := gatewaykit.StartGateway(t, nil)
	cfg := gatewaykit.Config(t)
	cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{hex.EncodeToString(sum[:])}}}
	tenanted := gatewaykit.StartGateway(t, cfg)

	// req is a raw POST of path whose header section (from the line after the request line to
	// the blank line) mangle rewrites.
	req := func(addr, path, auth, key, body string, mangle func(string) string) string {
		hdr := "Host: " + addr + "\r\n"
		if auth != "" {
			hdr += "Authorization: Bearer " + auth + "\r\n"
		}
		hdr += "Content-Type: application/json\r\nIdempotency-Key: " + key + "\r\nContent-Length: " +
			fmt.Sprint(len(body)) + "\r\nConnection: close\r\n\r\n"
		return "POST " + path + " HTTP/1.1\r\n" + mangle(hdr) + body
	}
	insert := func(line string) func(string) string {
		return func(h string) string { return line + h }
	}
	cases := []struct {
		name   string
		mangle func(string) string
		auth   bool // only with an Authorization header
	}{
		{name: "inside a value, the rest a header", mangle: insert("X-A: a\nX-B: b\r\n")},
		{name: "before a folded line", mangle: insert("X-A: a\n b\r\n")},
		{name: "ending one line", mangle: insert("X-A: a\n")},
		{name: "ending every line", mangle: func(h string) string { return strings.ReplaceAll(h, "\r\n", "\n") }},
		{name: "ending the header block", mangle: func(h string) string { return strings.TrimSuffix(h, "\r\n\r\n") + "\r\n\n" }},
		{name: "inside the Authorization value", auth: true, mangle: func(h string) string {
			return strings.Replace(h, secret+"\r\n", secret+"\nX-B: b\r\n", 1)
		}},
	}
	setups := []struct {
		name string
		gw   *gatewaykit.Gateway
		auth string
	}{
		{"no tenants, with Authorization", open, secret},
		{"no tenants, without Authorization", open, ""},
		{"tenant key in Authorization", tenanted, secret},
	}
	for si, su := range setups {
		addr := strings.TrimPrefix(su.gw.URL, "http://")
		mock := su.gw.Mock(t, "mock")
		status := map[string]string{}
		if su.auth != "" {
			status["Authorization"] = "Bearer " + su.auth
		}
		noRecord := func(t *testing.T, key string) {
			t.Helper()
			if r := do(t, http.MethodGet, su.gw.URL+"/v1/idempotency/"+key, "", status); r.Status != http.StatusNotFound {
				t.Errorf("key %s: status API %d %s, want 404 (no record)", key, r.Status, r.Body)
			}
		}
		for ci, c := range cases {
			if c.auth && su.auth == "" {
				continue
			}
			for _, path := range []string{chatPath, "/v1/messages"} {
				t.Run(su.name+"/"+c.name+"/"+path, func(t *testing.T) {
					key := fmt.Sprintf("bare-lf-%d-%d-%s", si, ci, strings.TrimPrefix(path, "/v1/")[:4])
					body := chatBody("oncegate-mock", "bare lf "+key, "")
					if path != chatPath {
						body = `{"model":"oncegate-mock","max_tokens":8,"messages":[{"role":"user","content":"bare lf ` + key + `"}]}`
					}
					before := mock.Stats().Requests
					all := rawExchange(t, addr, req(addr, path, su.auth, key, body, c.mangle))
					if su.auth != "" && strings.Contains(string(all), secret) {
						t.Errorf("the response echoes the API key:\n%s", all)
					}
					resp := parseRaw(t, all)
					if resp.Status != http.StatusBadRequest {
						t.Errorf("status = %d, want 400; body %s", resp.Status, resp.Body)
					}
					if path == chatPath {
						assertOpenAIError(t, resp, "malformed_request")
					} else if !isAnthropicInvalid(resp.Body) {
						t.Errorf("not an Anthropic invalid_request_error: %s", resp.Body)
					}
					if after := mock.Stats().Requests; after != before {
						t.Errorf("backend executions went %d -> %d", before, after)
					}
					noRecord(t, key)
				})
			}
		}
		t.Run(su.name+"/CRLF runs", func(t *testing.T) {
			key := fmt.Sprintf("bare-lf-%d-crlf", si)
			before := mock.Stats().Requests
			resp := rawRequest(t, addr, req(addr, chatPath, su.auth, key, chatBody("oncegate-mock", "bare lf "+key, ""),
				func(h string) string { return h }))
			if resp.Status != http.StatusOK {
				t.Fatalf("status = %d, want 200; body %s", resp.Status, resp.Body)
			}
			if after := mock.Stats().Requests; after != before+1 {
				t.Errorf("backend executions went %d -> %d, want +1", before, after)
			}
		})
	}
}

// rawExchange writes req on a new connection to addr and returns every byte the server sends
// until it closes the connection.
func rawExchange(t testing.TB, addr, req string) []byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	all, err := io.ReadAll(conn)
	if err != nil && len(all) == 0 {
		t.Fatalf("read: %v", err)
	}
	return all
}

// TestEqualNumbersOneIntent: a retry whose numbers are spelled otherwise (0.5 as 0.50, 1 as
// 1.0) is the same intent: replayed under its key, not a 422 for a different body.
func TestEqualNumbersOneIntent(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	hdr := map[string]string{"Idempotency-Key": "numbers-1"}
	first := postChat(t, gw.URL, chatBody("oncegate-mock", "numbers", `"temperature":0.5,"top_p":1`), hdr)
	b := first.Body
	if first.Status != http.StatusOK {
		t.Fatalf("first: status %d body %s", first.Status, b)
	}
	for _, extra := range []string{`"temperature":0.50,"top_p":1.0`, `"temperature":5e-1,"top_p":1e0`} {
		resp := postChat(t, gw.URL, chatBody("oncegate-mock", "numbers", extra), hdr)
		rb := resp.Body
		if resp.Status != http.StatusOK || resp.Header.Get("Oncegate-Idempotency") != "replayed" {
			t.Errorf("%s: status %d, Oncegate-Idempotency %q; want a replay: %s", extra, resp.Status, resp.Header.Get("Oncegate-Idempotency"), rb)
		}
	}
	if n := mock.Stats().Requests; n != 1 {
		t.Errorf("backend executions = %d, want 1", n)
	}
}

// TestBodyTooLargeFormat: a body over the limit is refused from its Content-Length, before
// routing, yet in its route's error format (its header was read whole, so the route is known).
func TestBodyTooLargeFormat(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.HTTP.MaxBodyBytes = 4 << 10
	gw := gatewaykit.StartGateway(t, cfg)
	addr := strings.TrimPrefix(gw.URL, "http://")
	for _, c := range []struct {
		path      string
		anthropic bool
	}{{chatPath, false}, {"/v1/messages", true}} {
		t.Run(c.path, func(t *testing.T) {
			// Only the header: the gateway answers from the Content-Length and closes.
			resp := rawRequest(t, addr, "POST "+c.path+" HTTP/1.1\r\nHost: "+addr+
				"\r\nContent-Type: application/json\r\nContent-Length: 65536\r\nConnection: close\r\n\r\n")
			b := resp.Body
			if resp.Status != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d body %s", resp.Status, b)
			}
			if !c.anthropic {
				assertOpenAIError(t, resp, "request_too_large")
				return
			}
			var e struct {
				Type  string                         `json:"type"`
				Error struct{ Type, Message string } `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
				t.Errorf("not an Anthropic error body (%v): %s", err, b)
			}
		})
	}
}
