package effects

import (
	"encoding/json"
	"testing"
)

// TestFingerprint: one fingerprint for one set of arguments however it is spelt (key order,
// spacing, a struct or its JSON), another for other arguments.
func TestFingerprint(t *testing.T) {
	type args struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
		CC      []int  `json:"cc"`
	}
	same := []any{
		json.RawMessage(`{"to":"a@b","subject":"hi","cc":[1,2]}`),
		json.RawMessage(` { "cc" : [ 1, 2 ], "subject":"hi", "to":"a@b" } `),
		[]byte(`{"subject":"hi","cc":[1,2],"to":"a@b"}`),
		args{To: "a@b", Subject: "hi", CC: []int{1, 2}},
		map[string]any{"cc": []int{1, 2}, "to": "a@b", "subject": "hi"},
	}
	want, err := Fingerprint(same[0])
	if err != nil || len(want) != 64 {
		t.Fatalf("Fingerprint = %q, %v", want, err)
	}
	for i, a := range same[1:] {
		if got, err := Fingerprint(a); err != nil || got != want {
			t.Errorf("spelling %d: %q, %v; want %q", i+2, got, err, want)
		}
	}
	for name, a := range map[string]any{
		"another value":   json.RawMessage(`{"to":"a@c","subject":"hi","cc":[1,2]}`),
		"another order":   json.RawMessage(`{"to":"a@b","subject":"hi","cc":[2,1]}`),
		"a member more":   json.RawMessage(`{"to":"a@b","subject":"hi","cc":[1,2],"bcc":null}`),
		"a number string": json.RawMessage(`{"to":"a@b","subject":"hi","cc":["1",2]}`),
	} {
		if got, err := Fingerprint(a); err != nil || got == want {
			t.Errorf("%s: %q, %v; want another fingerprint", name, got, err)
		}
	}
	if _, err := Fingerprint(json.RawMessage(`{"to":`)); err == nil {
		t.Error("arguments that are not JSON: no error")
	}
}
