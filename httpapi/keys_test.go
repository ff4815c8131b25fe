package httpapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/jsonscan/jsonref"
)

func TestParseIdempotencyKey(t *testing.T) {
	var printable strings.Builder
	for c := byte(0x20); c <= 0x7e; c++ {
		printable.WriteByte(c)
	}
	cases := []struct {
		name string
		raw  string
		want string
		err  error
	}{
		{name: "bare", raw: "abc", want: "abc"},
		{name: "one character", raw: "x", want: "x"},
		{name: "uuid", raw: "8e2f7a1c-3b4d-4e5f-9a0b-1c2d3e4f5a6b", want: "8e2f7a1c-3b4d-4e5f-9a0b-1c2d3e4f5a6b"},
		{name: "bare, surrounding whitespace trimmed", raw: " \t abc \t ", want: "abc"},
		{name: "bare, inner space kept", raw: "a b", want: "a b"},
		{name: "bare, a quote inside", raw: `ab"c`, want: `ab"c`},
		{name: "bare, every printable ASCII character", raw: "!" + printable.String(), want: "!" + printable.String()},
		{name: "bare, 255 characters", raw: strings.Repeat("k", 255), want: strings.Repeat("k", 255)},
		{name: "quoted", raw: `"abc"`, want: "abc"},
		{name: "quoted, surrounding whitespace trimmed", raw: `  "abc"  `, want: "abc"},
		{name: "quoted, inner spaces kept", raw: `" a "`, want: " a "},
		{name: "quoted, escapes", raw: `"a\"b\\c"`, want: `a"b\c`},
		{name: "quoted, 255 after unescaping", raw: `"` + strings.Repeat(`\"`, 255) + `"`, want: strings.Repeat(`"`, 255)},
		{name: "empty", raw: "", err: errKeyEmpty},
		{name: "whitespace only", raw: "  \t ", err: errKeyEmpty},
		{name: "quoted empty", raw: `""`, err: errKeyEmpty},
		{name: "256 characters", raw: strings.Repeat("k", 256), err: errKeyTooLong},
		{name: "quoted, 256 after unescaping", raw: `"` + strings.Repeat(`\\`, 256) + `"`, err: errKeyTooLong},
		{name: "tab inside", raw: "a\tb", err: errKeyCharset},
		{name: "NUL", raw: "a\x00b", err: errKeyCharset},
		{name: "DEL", raw: "a\x7fb", err: errKeyCharset},
		{name: "Latin-1 byte", raw: "a\xe9b", err: errKeyCharset},
		{name: "UTF-8", raw: "clé", err: errKeyCharset},
		{name: "quoted control character", raw: "\"a\x01b\"", err: errKeyCharset},
		{name: "quoted UTF-8", raw: `"clé"`, err: errKeyCharset},
		{name: "lone quote", raw: `"`, err: errKeyMalformed},
		{name: "unterminated", raw: `"abc`, err: errKeyMalformed},
		{name: "escaped closing quote", raw: `"abc\"`, err: errKeyMalformed},
		{name: "text after the closing quote", raw: `"abc"def`, err: errKeyMalformed},
		{name: "two strings", raw: `"a" "b"`, err: errKeyMalformed},
		{name: "unknown escape", raw: `"a\nb"`, err: errKeyMalformed},
		{name: "trailing backslash", raw: `"abc\`, err: errKeyMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseIdempotencyKey(c.raw)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("parseIdempotencyKey(%q) = %q, %v; want error %v", c.raw, got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("parseIdempotencyKey(%q) = %q, %v; want %q", c.raw, got, err, c.want)
			}
		})
	}
}

// sfQuote writes key as an RFC 8941 sf-string.
func sfQuote(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// FuzzParseIdempotencyKey: never panics; an accepted key is 1-255 printable ASCII characters;
// a bare header value is accepted as itself (trimmed); an accepted key quoted as an sf-string
// parses back to itself, and so does the key sent bare when it can be.
func FuzzParseIdempotencyKey(f *testing.F) {
	for _, s := range []string{"abc", " abc ", `"abc"`, `"a\"b\\c"`, `""`, `"`, `"abc`, `"a"b`, "a\tb", "clé",
		strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat(`\"`, 255) + `"`, "\x00", " \" a \" "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		key, err := parseIdempotencyKey(raw)
		if err != nil {
			if !errors.Is(err, errKeyEmpty) && !errors.Is(err, errKeyTooLong) && !errors.Is(err, errKeyCharset) && !errors.Is(err, errKeyMalformed) {
				t.Fatalf("parseIdempotencyKey(%q): error %v is none of the sentinels", raw, err)
			}
			return
		}
		if len(key) < 1 || len(key) > MaxKeyLength {
			t.Fatalf("parseIdempotencyKey(%q) accepted %q: %d characters", raw, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("parseIdempotencyKey(%q) accepted %q: byte %#x at %d is not printable ASCII", raw, key, key[i], i)
			}
		}
		if trimmed := strings.TrimSpace(raw); trimmed[0] != '"' && key != trimmed {
			t.Fatalf("bare value %q accepted as %q, want %q", raw, key, trimmed)
		}
		q := sfQuote(key)
		if back, err := parseIdempotencyKey(q); err != nil || back != key {
			t.Fatalf("key %q quoted as %q parses to %q, %v", key, q, back, err)
		}
		if key[0] != '"' && key == strings.TrimSpace(key) {
			if back, err := parseIdempotencyKey(key); err != nil || back != key {
				t.Fatalf("key %q sent bare parses to %q, %v", key, back, err)
			}
		}
	})
}

func TestCanonicalFingerprint(t *testing.T) {
	const base = `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`
	same := []struct{ name, a, b string }{
		{"keys reordered", base, `{"temperature":0.5,"messages":[{"content":"hi","role":"user"}],"model":"m"}`},
		{"whitespace", base, "{ \"model\" : \"m\" ,\n\t\"messages\" : [ { \"role\" : \"user\" , \"content\" : \"hi\" } ] , \"temperature\" : 0.5 }\n"},
		{"stream true", base, `{"stream":true,"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`},
		{"stream false", base, `{"stream":false,"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`},
		{"stream null", base, `{"stream":null,"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`},
		{"stream_options", base, `{"stream":true,"stream_options":{"include_usage":true},"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`},
		{"string escapes", base, `{"model":"\u006d","messages":[{"role":"user","content":"h\u0069"}],"temperature":0.5}`},
		{"number trailing zero", base, strings.Replace(base, "0.5", "0.50", 1)},
		{"number exponent", base, strings.Replace(base, "0.5", "5e-1", 1)},
		{"whole number as a float", `{"model":"m","messages":[],"n":1}`, `{"model":"m","messages":[],"n":1.0}`},
		{"whole number with an exponent", `{"model":"m","messages":[],"n":100}`, `{"model":"m","messages":[],"n":1e2}`},
		{"negative zero", `{"model":"m","messages":[],"n":0}`, `{"model":"m","messages":[],"n":-0.0}`},
		{"nested number", `{"model":"m","messages":[],"x":{"y":[0.25]}}`, `{"model":"m","messages":[],"x":{"y":[25e-2]}}`},
	}
	for _, c := range same {
		t.Run("same/"+c.name, func(t *testing.T) {
			fa, _, ea := canonicalFingerprint([]byte(c.a))
			fb, _, eb := canonicalFingerprint([]byte(c.b))
			if ea != nil || eb != nil || fa != fb {
				t.Fatalf("fingerprints %s (%v) and %s (%v) of\n%s\n%s\nwant equal", fa, ea, fb, eb, c.a, c.b)
			}
		})
	}
	differ := []struct{ name, a, b string }{
		{"other content", base, strings.Replace(base, `"hi"`, `"hi!"`, 1)},
		{"other model", base, strings.Replace(base, `"m"`, `"n"`, 1)},
		{"extra parameter", base, `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"top_p":1}`},
		{"other number", base, strings.Replace(base, "0.5", "0.51", 1)},
		{"big integers stay exact", `{"model":"m","messages":[],"seed":9007199254740993}`, `{"model":"m","messages":[],"seed":9007199254740992}`},
		{"number type", base, strings.Replace(base, "0.5", `"0.5"`, 1)},
		{"stream nested in a message is content", base, `{"model":"m","messages":[{"role":"user","content":"hi","stream":true}],"temperature":0.5}`},
		{"Stream is not stream", base, `{"Stream":true,"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`},
		{"message order", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"b"},{"role":"user","content":"a"}]}`},
		{"null vs absent", base, `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"user":null}`},
	}
	for _, c := range differ {
		t.Run("differ/"+c.name, func(t *testing.T) {
			fa, _, ea := canonicalFingerprint([]byte(c.a))
			fb, _, eb := canonicalFingerprint([]byte(c.b))
			if ea != nil || eb != nil || fa == fb {
				t.Fatalf("fingerprints %s (%v) and %s (%v) of\n%s\n%s\nwant different", fa, ea, fb, eb, c.a, c.b)
			}
		})
	}
	for _, c := range []struct{ name, body string }{
		{name: "empty", body: ``},
		{name: "not JSON", body: `hello`},
		{name: "null", body: `null`},
		{name: "array", body: `[{"model":"m"}]`},
		{name: "string", body: `"x"`},
		{name: "number", body: `1`},
		{name: "truncated", body: `{"model":"m"`},
		{name: "second object", body: `{"a":1}{"b":2}`},
		{name: "trailing garbage", body: `{"a":1} x`},
		{name: "trailing close brace", body: `{"a":1}}`},
		{name: "trailing close bracket", body: `{"a":1}]`},
		{name: "trailing close brace after whitespace", body: "{\"a\":1} \n}"},
		{name: "duplicate key", body: `{"model":"x","model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{name: "duplicate key, nested", body: `{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`},
		{name: "duplicate key, one escaped", body: `{"model":"m","\u006dodel":"n","messages":[]}`},
		{name: "invalid UTF-8", body: "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"},
		{name: "lone surrogate", body: `{"model":"m","messages":[{"role":"user","content":"\ud800"}]}`},
		{name: "number out of range", body: `{"model":"m","messages":[],"temperature":1e999}`},
		{name: "5000-digit max_tokens", body: `{"model":"m","messages":[],"max_tokens":` + strings.Repeat("9", 5000) + `}`},
	} {
		t.Run("error/"+c.name, func(t *testing.T) {
			if fp, _, err := canonicalFingerprint([]byte(c.body)); err == nil {
				t.Fatalf("canonicalFingerprint(%q) = %s, want an error", c.body, fp)
			}
		})
	}
}

// rewrite serializes v as JSON with object keys in reverse order and whitespace between
// every token: the same document, other bytes.
func rewrite(buf *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Sort(sort.Reverse(sort.StringSlice(keys)))
		buf.WriteString("{ ")
		for i, k := range keys {
			if i > 0 {
				buf.WriteString(" ,\n")
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteString(" :\t")
			rewrite(buf, x[k])
		}
		buf.WriteString(" }")
	case []any:
		buf.WriteString("[ ")
		for i, e := range x {
			if i > 0 {
				buf.WriteString(" , ")
			}
			rewrite(buf, e)
		}
		buf.WriteString(" ]")
	case json.Number:
		buf.WriteString(x.String())
	default: // string, bool, nil
		b, _ := json.Marshal(x)
		buf.Write(b)
	}
}

func rewritten(v any) []byte {
	var buf bytes.Buffer
	buf.WriteString(" \n")
	rewrite(&buf, v)
	buf.WriteString("\r\n")
	return buf.Bytes()
}

// mutateLeaf changes the first string or number found in v (depth first, keys sorted) and
// reports whether it found one.
func mutateLeaf(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if nv, ok := mutateLeaf(x[k]); ok {
				m := make(map[string]any, len(x))
				for kk, vv := range x {
					m[kk] = vv
				}
				m[k] = nv
				return m, true
			}
		}
	case []any:
		for i, e := range x {
			if nv, ok := mutateLeaf(e); ok {
				s := append([]any(nil), x...)
				s[i] = nv
				return s, true
			}
		}
	case string:
		return x + "~", true
	case json.Number: // another value (0.0 and 0 are one value)
		if f, _ := strconv.ParseFloat(string(x), 64); f == 0 {
			return json.Number("1"), true
		}
		return json.Number("0"), true
	}
	return v, false
}

// checkFields: what parseGeneration reads from fields is what it read from the decoded body.
func checkFields(t *testing.T, fields bodyFields, obj map[string]any) {
	t.Helper()
	model, ok := fields.str("model")
	if wm, wok := obj["model"].(string); ok != wok || model != wm {
		t.Fatalf("model %q %v; decoded %q %v", model, ok, wm, wok)
	}
	msgs, _ := obj["messages"].([]any)
	if fields.nonEmptyArray("messages") != (len(msgs) > 0) {
		t.Fatalf("messages non-empty %v; decoded %v", fields.nonEmptyArray("messages"), msgs)
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		n, ok := fields.number(k)
		if wn, wok := obj[k].(json.Number); ok != wok || n != wn {
			t.Fatalf("%s %q %v; decoded %q %v", k, n, ok, wn, wok)
		}
	}
	v, present := fields["stream"]
	if wv, wpresent := obj["stream"]; present != wpresent || (string(v) == "null") != (wv == nil && wpresent) {
		t.Fatalf("stream %q %v; decoded %v %v", v, present, wv, wpresent)
	}
	so, ok := fields.object("stream_options")
	wso, wok := obj["stream_options"].(map[string]any)
	usage, _ := so["include_usage"].(bool)
	wusage, _ := wso["include_usage"].(bool)
	if ok != wok || usage != wusage {
		t.Fatalf("stream_options %v %v; decoded %v %v", so, ok, wso, wok)
	}
}

// referenceFingerprint is the fingerprint as jsonref computes it (encoding/json, with the
// rules jsonscan adds written the slow way): the body decoded into a map with UseNumber, the
// transport fields deleted, numbers rewritten, encoded again, hashed. It also returns the
// decoded body.
func referenceFingerprint(body []byte) (string, map[string]any, error) {
	canon, obj, err := jsonref.Canonical(body, isTransportField)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), obj, nil
}

// FuzzCanonicalFingerprint: never panics; equals the jsonref reference; the fingerprint ignores key order, whitespace and
// the transport fields (stream, stream_options: added, changed or removed); any other change
// of the document changes it.
func FuzzCanonicalFingerprint(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"a":{"z":[1,2.50,-3e7,{"b":null,"c":true}],"y":"\u00e9\ud83d\ude00<>&"},"n":0}`,
		`{}`, `{"stream":true}`, `{"a":1}}`, `[1]`, `null`, `{"a":"\xff"}`, `{"a":1,"a":2}`,
		`{"model":"m","messages":[ ],"max_tokens":-1,"stream":null,"stream_options":{"include_usage":{"x":1}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fp, fields, err := canonicalFingerprint(body)
		want, obj, werr := referenceFingerprint(body)
		if (err == nil) != (werr == nil) || fp != want {
			t.Fatalf("fingerprint %q (error %v); jsonref's %q (error %v)", fp, err, want, werr)
		}
		if err != nil {
			return
		}
		checkFields(t, fields, obj)
		if _, herr := hex.DecodeString(fp); herr != nil || len(fp) != 64 {
			t.Fatalf("fingerprint %q is not 64 hex characters", fp)
		}
		check := func(what string, doc []byte, wantSame bool) {
			t.Helper()
			got, _, err := canonicalFingerprint(doc)
			if err != nil {
				t.Fatalf("%s: %q: %v", what, doc, err)
			}
			if (got == fp) != wantSame {
				t.Fatalf("%s: fingerprint equal=%v, want %v\norig %q\n now %q", what, got == fp, wantSame, body, doc)
			}
		}
		with := func(change func(m map[string]any)) map[string]any {
			m := make(map[string]any, len(obj)+2)
			for k, v := range obj {
				m[k] = v
			}
			change(m)
			return m
		}
		check("keys reordered and re-spaced", rewritten(obj), true)
		for name, change := range map[string]func(map[string]any){
			"stream removed":         func(m map[string]any) { delete(m, "stream"); delete(m, "stream_options") },
			"stream true":            func(m map[string]any) { m["stream"] = true },
			"stream false":           func(m map[string]any) { m["stream"] = false },
			"stream_options set":     func(m map[string]any) { m["stream"], m["stream_options"] = true, map[string]any{"include_usage": true} },
			"stream_options changed": func(m map[string]any) { m["stream_options"] = []any{json.Number("7")} },
		} {
			check(name, rewritten(with(change)), true)
		}
		extra := "og_fuzz_extra"
		for obj[extra] != nil {
			extra += "_"
		}
		check("a key added", rewritten(with(func(m map[string]any) { m[extra] = json.Number("1") })), false)
		for k, v := range obj {
			if k == "stream" || k == "stream_options" {
				continue
			}
			check("value of "+k+" wrapped", rewritten(with(func(m map[string]any) { m[k] = []any{v} })), false)
			check(k+" removed", rewritten(with(func(m map[string]any) { delete(m, k) })), false)
		}
		if m, ok := mutateLeaf(with(func(m map[string]any) { delete(m, "stream"); delete(m, "stream_options") })); ok {
			check("a leaf changed", rewritten(m), false)
		}
	})
}

// TestFingerprintErrorsNameNoPackage: the reason given to a client for a malformed body says
// what and where, without internal package names.
func TestFingerprintErrorsNameNoPackage(t *testing.T) {
	for _, body := range []string{`{"model":`, `{"a":1} x`, `[1]`, ``} {
		_, _, err := canonicalFingerprint([]byte(body))
		if err == nil || strings.Contains(err.Error(), "jsonscan") {
			t.Errorf("canonicalFingerprint(%q): %v", body, err)
		}
	}
	if _, _, err := canonicalFingerprint([]byte(`{"model":`)); err == nil || !strings.Contains(err.Error(), "offset 9") {
		t.Errorf("a truncated body: %v, want the offset where it ends", err)
	}
}
