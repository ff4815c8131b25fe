package jsonscan

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/jsonscan/jsonref"
)

func leaveStream(k string) bool { return k == "stream" || k == "stream_options" }

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{}`, `{}`},
		{` { "b" : [ 1 , 2.50 , -3e7 ] , "a" : { "d" : null , "c" : true } } `, `{"a":{"c":true,"d":null},"b":[1,2.5,-30000000]}`},
		{`{"k":"<b>&\u00e9\u2028\n\/"}`, `{"k":"\u003cb\u003e\u0026é\u2028\n/"}`},
		{"{\"k\":\"é\u2028\"}", `{"k":"é\u2028"}`},
		{`{"k":"\ud83d\ude00"}`, `{"k":"😀"}`},
		{`{"k":"\ud7ff\ue000\uffff"}`, "{\"k\":\"\ud7ff\ue000\uffff\"}"}, // around the surrogates
		{`{"stream":true,"stream_options":{},"model":"m"}`, `{"model":"m"}`},
		{`{"x":{"stream":true}}`, `{"x":{"stream":true}}`},
		{`{"a":"\u0061","\u0061b":1,"ab ":2}`, `{"a":"a","ab":1,"ab ":2}`},
		// numbers: one spelling per value
		{`{"t":[0.5,0.50,5e-1,5E-1,0.5e0,50e-2]}`, `{"t":[0.5,0.5,0.5,0.5,0.5,0.5]}`},
		{`{"n":[1,1.0,1e0,10e-1,100,1e2,1.00e+2]}`, `{"n":[1,1,1,1,100,100,100]}`},
		{`{"z":[0,-0,0.0,-0.0,0e5,-0E-3,1e-400]}`, `{"z":[0,0,0,0,0,0,0]}`},
		{`{"f":[-2.50,1e21,1.5e-7,123456.7890,1e-6]}`, `{"f":[-2.5,1e+21,1.5e-7,123456.789,0.000001]}`},
		// integers written as integers stay exact past 2^53; written as floats they are float64s
		{`{"i":[9007199254740993,9007199254740993.0,12345678901234567890123]}`, `{"i":[9007199254740993,9007199254740992,12345678901234567890123]}`},
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
	for _, tc := range []struct {
		in     string
		kind   error
		offset int
	}{
		{`{"a":1,"a":2}`, ErrDuplicateKey, 7},
		{`{"a":1,"\u0061":2}`, ErrDuplicateKey, 7},
		{`{"x":[{"b":1,"c":{"d":0,"d":0}}]}`, ErrDuplicateKey, 24},
		{`{"stream":true,"stream":false}`, ErrDuplicateKey, 15},
		{"{\"a\":\"ok\xffno\"}", ErrInvalidUTF8, 8},
		{"{\"a\xc3\":1}", ErrInvalidUTF8, 3},
		{"{\"a\":\"\xed\xa0\x80\"}", ErrInvalidUTF8, 6}, // a surrogate encoded in UTF-8
		{`{"a":"x\ud800"}`, ErrInvalidUTF8, 7},
		{`{"a":"\ud800\u0041"}`, ErrInvalidUTF8, 6},
		{`{"a":"\udc00\ud800"}`, ErrInvalidUTF8, 6},
		{`{"n":1e400}`, ErrNumberRange, 5},
		{`{"n":[-1e309]}`, ErrNumberRange, 6},
		{`{"max_tokens":1` + strings.Repeat("0", 5000) + `}`, ErrNumberRange, 14},
	} {
		_, _, err := Canonical(nil, []byte(tc.in), nil)
		var se *SyntaxError
		if !errors.Is(err, tc.kind) || !errors.Is(err, ErrSyntax) || !errors.As(err, &se) || se.Offset != tc.offset {
			t.Errorf("Canonical(%.60q): %v; want %v at offset %d", tc.in, err, tc.kind, tc.offset)
		}
	}
}

// TestDuplicateKeysLargeObject: past smallObject keys an object's keys are found in a map;
// a duplicate is found on both sides of the switch, and an object after a large one at the
// same depth starts empty. Object, which checks only what encoding/json.Valid checks,
// accepts them all.
func TestDuplicateKeysLargeObject(t *testing.T) {
	obj := func(n int, extra string) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		b.WriteString(extra + "}")
		return b.String()
	}
	for _, tc := range []struct {
		name string
		in   string
		dup  bool
	}{
		{"large, unique", obj(100, `"z":0`), false},
		{"large, duplicate of an early key", obj(100, `"k3":0`), true},
		{"large, duplicate of a late key", obj(100, `"k99":0`), true},
		{"small, duplicate", obj(smallObject-2, `"k0":0`), true},
		{"siblings reuse the set", `{"a":` + obj(40, `"z":0`) + `,"b":` + obj(40, `"z":0`) + `}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Canonical(nil, []byte(tc.in), nil); errors.Is(err, ErrDuplicateKey) != tc.dup || (!tc.dup && err != nil) {
				t.Errorf("Canonical: %v, want duplicate %v", err, tc.dup)
			}
			if _, err := Object([]byte(tc.in)); err != nil {
				t.Errorf("Object: %v", err)
			}
		})
	}
}

// FuzzCanonical: Canonical gives jsonref's canonical form (encoding/json's, numbers rewritten)
// byte for byte, accepts what jsonref accepts, and its top-level members are the decoded
// object's.
// TestCanonicalOrdersInPlace: members are put in key order where they were written, by
// rotation for a few and through one copy for many, with left-out members cut from any
// position; the output is jsonref's. The cases are the shapes the fuzzer rarely builds.
func TestCanonicalOrdersInPlace(t *testing.T) {
	big := strings.Repeat("x", 1<<16)
	var many, manyNested strings.Builder
	many.WriteString("{")
	for i := 40; i > 0; i-- {
		fmt.Fprintf(&many, `"k%02d":%d,`, i, i)
	}
	many.WriteString(`"stream":true}`)
	manyNested.WriteString(`{"z":` + many.String() + `,"a":[` + many.String() + `]}`)
	for _, tc := range []struct{ name, body string }{
		{"sorted", `{"a":1,"b":"` + big + `","c":null}`},
		{"two large members swapped", `{"b":"` + big + `","a":"` + big + `y"}`},
		{"small before large", `{"model":"m","messages":[{"role":"user","content":"` + big + `"}],"stream":true}`},
		{"left out first, middle and last", `{"stream":1,"b":2,"stream_options":{},"a":3}`},
		{"only left-out members", `{"stream":true}`},
		{"reversed, more than sorted in place", many.String()},
		{"many members nested", manyNested.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := Canonical(nil, []byte(tc.body), leaveStream)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := jsonref.Canonical([]byte(tc.body), leaveStream)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("Canonical\n %.300q\njsonref\n %.300q", got, want)
			}
		})
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"hi\n"}],"stream":true}`,
		`{"a":{"z":[1,2.50,-3e7,{"b":null,"c":true}],"y":"\u00e9\ud83d\ude00<>&"},"n":0}`, `{"a":"\xff\xe2\x80\xa8"}`,
		`{"a":1,"a":2,"stream":1}`, `{"k\u0041":"\"q\""}`, `[1]`, `null`, `{"a":1}}`, "{\"\u2029\":\"\x7f\"}",
		`{"n":[0.50,1.0,-0,1e400,9007199254740993,1e21,5e-7]}`, `{"a":"\ud800"}`, `{"a":{"b":1,"\u0062":2}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, top, err := Canonical(nil, data, leaveStream)
		want, obj, werr := jsonref.Canonical(data, leaveStream)
		if (err == nil) != (werr == nil) {
			t.Fatalf("Canonical error %v, jsonref %v", err, werr)
		}
		if err != nil {
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("Canonical\n %q\njsonref\n %q", got, want)
		}
		for _, minSpan := range []int{1, 4} { // every string a span; short ones copied
			sum, _, err := canonicalSum(data, leaveStream, minSpan)
			if err != nil || sum != sha256.Sum256(got) {
				t.Fatalf("canonicalSum (spans from %d bytes) = %x, %v; want the SHA-256 of %q", minSpan, sum, err, got)
			}
		}
		if len(top) != len(obj) {
			t.Fatalf("%d top-level members, jsonref %d", len(top), len(obj))
		}
		for k := range obj {
			raw, ok := top[k]
			if !ok || !json.Valid(raw) || strings.TrimSpace(string(raw)) != string(raw) {
				t.Fatalf("member %q: %q", k, raw)
			}
		}
	})
}

// TestCanonicalSum: the sum of canonical output whose long strings are hashed in place is the
// sum of the output itself, however the members move (sorted by rotation and through a copy,
// cut out), and it allocates a fraction of a large body where Canonical copies all of it.
func TestCanonicalSum(t *testing.T) {
	long := func(c string) string { return strings.Repeat(c, spanMin) }
	many := make([]string, 0, 20) // more members than sortInPlaceMax, in reverse order
	for i := 19; i >= 0; i-- {
		many = append(many, fmt.Sprintf(`"k%02d":"%s%d"`, i, long("m"), i))
	}
	cases := map[string]string{
		"prompt":          `{"model":"m","messages":[{"role":"user","content":"` + long("p") + `"}]}`,
		"unsorted":        `{"z":"` + long("z") + `","a":"` + long("a") + `","m":{"y":"` + long("y") + `","b":1}}`,
		"cut out":         `{"stream":"` + long("s") + `","b":"` + long("b") + `","a":2}`,
		"many members":    "{" + strings.Join(many, ",") + "}",
		"escaped copied":  `{"b":"` + long(`\n`) + `","a":"` + long("x") + `"}`,
		"exactly spanMin": `{"b":"` + strings.Repeat("q", spanMin-2) + `","a":"x"}`,
		"no long strings": `{"b":"x","a":[1,2.50]}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			want, wantTop, err := Canonical(nil, []byte(body), leaveStream)
			if err != nil {
				t.Fatal(err)
			}
			sum, top, err := CanonicalSum([]byte(body), leaveStream)
			if err != nil || sum != sha256.Sum256(want) {
				t.Fatalf("CanonicalSum = %x, %v; want the SHA-256 of %s", sum, err, want)
			}
			if len(top) != len(wantTop) {
				t.Fatalf("%d top-level members, Canonical %d", len(top), len(wantTop))
			}
		})
	}
	if _, _, err := CanonicalSum([]byte(`{"a":1,"a":2}`), nil); !errors.Is(err, ErrDuplicateKey) {
		t.Errorf("duplicate keys: %v, want ErrDuplicateKey", err)
	}

	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox. ", 200_000) + `"}]}`)
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	copied := allocated(func() { _, _, _ = Canonical(make([]byte, 0, len(body)), body, leaveStream) })
	summed := allocated(func() { _, _, _ = CanonicalSum(body, leaveStream) })
	if copied < uint64(len(body)) || summed > uint64(len(body))/16 {
		t.Errorf("a %d-byte body: Canonical allocated %d bytes, CanonicalSum %d (want under 1/16 of the body)", len(body), copied, summed)
	}
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
	b.Run("jsonscan-sha256", func(b *testing.B) { // the fingerprint as it was taken before CanonicalSum
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			canon, _, err := Canonical(make([]byte, 0, len(body)), body, leaveStream)
			if err != nil {
				b.Fatal(err)
			}
			_ = sha256.Sum256(canon)
		}
	})
	b.Run("CanonicalSum", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := CanonicalSum(body, leaveStream); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jsonref", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, _, err := jsonref.Canonical(body, leaveStream); err != nil {
				b.Fatal(err)
			}
		}
	})
}
