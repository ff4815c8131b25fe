package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestObject(t *testing.T) {
	for _, tc := range []struct {
		in      string
		members []string // key=value, raw
		err     error
	}{
		{`{}`, nil, nil},
		{` {"a" : 1 , "b":[true,{"c":null}], "a":"x\"y"} `, []string{`"a"=1`, `"b"=[true,{"c":null}]`, `"a"="x\"y"`}, nil},
		{`{"k\u0041":-0.5e+3}`, []string{`"k\u0041"=-0.5e+3`}, nil},
		{`[1,2]`, nil, ErrNotObject},
		{`"s"`, nil, ErrNotObject},
		{`null`, nil, ErrNotObject},
		{``, nil, ErrSyntax},
		{`{`, nil, ErrSyntax},
		{`{"a":1,}`, nil, ErrSyntax},
		{`{"a":01}`, nil, ErrSyntax},
		{`{"a":1}}`, nil, ErrSyntax},
		{`{"a":"` + "\x01" + `"}`, nil, ErrSyntax},
		{`{"a":"\x"}`, nil, ErrSyntax},
		{`{"a":tru}`, nil, ErrSyntax},
		{strings.Repeat("[", 10001) + strings.Repeat("]", 10001), nil, ErrSyntax},
	} {
		got, err := Object([]byte(tc.in))
		if !errors.Is(err, tc.err) {
			t.Errorf("Object(%.40q): error %v, want %v", tc.in, err, tc.err)
			continue
		}
		var kv []string
		for _, m := range got {
			kv = append(kv, string(m.Key)+"="+string(m.Value))
		}
		if strings.Join(kv, " ") != strings.Join(tc.members, " ") {
			t.Errorf("Object(%q) = %v, want %v", tc.in, kv, tc.members)
		}
	}
}

// FuzzObject: Object accepts exactly what encoding/json.Valid accepts, and an object's members
// are what encoding/json decodes (the last of duplicate keys wins there).
func FuzzObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"model":"m","messages":[{"role":"user","content":"hi\n"}],"stream":true}`,
		`[1,2,{"a":null}]`, `{"a":1e5,"b":-0,"c":"\u00e9\ud83d"}`, ` "x" `, `{"a":{"b":[]}}`, `tru`, `{"a":1,}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		members, err := Object(data)
		valid := json.Valid(data)
		if (err == nil || errors.Is(err, ErrNotObject)) != valid {
			t.Fatalf("Object: %v; json.Valid: %v", err, valid)
		}
		if err != nil {
			return
		}
		var want map[string]json.RawMessage
		if uerr := json.Unmarshal(data, &want); uerr != nil {
			t.Fatalf("Object accepted an object encoding/json does not decode: %v", uerr)
		}
		got := map[string]json.RawMessage{}
		for _, m := range members {
			var k string
			if kerr := json.Unmarshal(m.Key, &k); kerr != nil {
				t.Fatalf("key %q: %v", m.Key, kerr)
			}
			got[k] = m.Value
		}
		if len(got) != len(want) {
			t.Fatalf("%d keys, encoding/json has %d", len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("key %q: value %q, encoding/json %q", k, got[k], v)
			}
		}
	})
}

func BenchmarkObject64KiB(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox. ", 3200) + `"}],"stream":false}`)
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := Object(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-probe", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		var probe struct {
			Stream        *bool           `json:"stream"`
			StreamOptions json.RawMessage `json:"stream_options"`
		}
		for b.Loop() {
			if err := json.Unmarshal(body, &probe); err != nil {
				b.Fatal(err)
			}
		}
	})
}
