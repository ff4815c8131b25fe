package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// referenceCanonical is the canonical form as encoding/json gives it: the object decoded into
// a map with UseNumber, leave's keys removed, encoded again.
func referenceCanonical(data []byte, leave func(string) bool) ([]byte, map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("trailing data")
	}
	if obj == nil {
		return nil, nil, errors.New("not an object")
	}
	out := map[string]any{}
	for k, v := range obj {
		if leave == nil || !leave(k) {
			out[k] = v
		}
	}
	b, err := json.Marshal(out)
	return b, obj, err
}

func leaveStream(k string) bool { return k == "stream" || k == "stream_options" }

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{}`, `{}`},
		{` { "b" : [ 1 , 2.50 , -3e7 ] , "a" : { "d" : null , "c" : true } } `, `{"a":{"c":true,"d":null},"b":[1,2.50,-3e7]}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`{"k":"<b>&\u00e9\u2028\n\/"}`, `{"k":"\u003cb\u003e\u0026é\u2028\n/"}`},
		{`{"stream":true,"stream_options":{},"model":"m"}`, `{"model":"m"}`},
		{`{"x":{"stream":true}}`, `{"x":{"stream":true}}`},
		{"{\"bad\":\"\xff\"}", "{\"bad\":\"\uFFFD\"}"}, // invalid UTF-8 decodes to U+FFFD, written as it is
	} {
		got, _, err := Canonical(nil, []byte(tc.in), leaveStream)
		if err != nil || string(got) != tc.want {
			t.Errorf("Canonical(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{`[1]`, `null`, `"s"`, `1`} {
		if _, _, err := Canonical(nil, []byte(in), nil); !errors.Is(err, ErrNotObject) {
			t.Errorf("Canonical(%s): %v, want ErrNotObject", in, err)
		}
	}
	for _, in := range []string{``, `{`, `{"a":1}}`, `{"a":1} x`, `{"a":01}`, `[`} {
		if _, _, err := Canonical(nil, []byte(in), nil); !errors.Is(err, ErrSyntax) {
			t.Errorf("Canonical(%q): %v, want ErrSyntax", in, err)
		}
	}
}

// FuzzCanonical: Canonical gives encoding/json's canonical form byte for byte, accepts what
// encoding/json accepts, and its top-level members are the decoded object's.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"hi\n"}],"stream":true}`,
		`{"a":{"z":[1,2.50,-3e7,{"b":null,"c":true}],"y":"\u00e9\ud83d\ude00<>&"},"n":0}`, `{"a":"\xff\xe2\x80\xa8"}`,
		`{"a":1,"a":2,"stream":1}`, `{"k\u0041":"\"q\""}`, `[1]`, `null`, `{"a":1}}`, "{\"\u2029\":\"\x7f\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, top, err := Canonical(nil, data, leaveStream)
		want, obj, werr := referenceCanonical(data, leaveStream)
		if (err == nil) != (werr == nil) {
			t.Fatalf("Canonical error %v, encoding/json %v", err, werr)
		}
		if err != nil {
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("Canonical\n %q\nencoding/json\n %q", got, want)
		}
		if len(top) != len(obj) {
			t.Fatalf("%d top-level members, encoding/json %d", len(top), len(obj))
		}
		for k := range obj {
			raw, ok := top[k]
			if !ok || !json.Valid(raw) || strings.TrimSpace(string(raw)) != string(raw) {
				t.Fatalf("member %q: %q", k, raw)
			}
		}
	})
}

func BenchmarkCanonical64KiB(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + strings.Repeat("The quick brown fox. ", 3200) + `"}],"stream":false,"temperature":0.2}`)
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, _, err := Canonical(nil, body, leaveStream); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, _, err := referenceCanonical(body, leaveStream); err != nil {
				b.Fatal(err)
			}
		}
	})
}
