package backend

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestPrepareBody(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		stream bool
		want   string // "" = unchanged
	}{
		{"non-stream untouched", `{"model":"m","messages":[],"x_custom":1}`, false, ""},
		{"non-stream drops stream fields", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, false, `{"model":"m"}`},
		{"stream adds stream and usage", `{"model":"m","x_custom":{"a":1}}`, true, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"x_custom":{"a":1}}`},
		{"stream keeps other stream options", `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}`, true, `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`},
		{"stream already asking for usage untouched", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PrepareBody([]byte(tc.in), tc.stream)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if string(got) != tc.in {
					t.Fatalf("changed: %s", got)
				}
				return
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatalf("output not JSON: %s", got)
			}
			_ = json.Unmarshal([]byte(tc.want), &w)
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("got %s\nwant %s", got, tc.want)
			}
		})
	}
	// Valid JSON that is not an object has no field to set: an error, never a panic.
	for _, in := range []string{`[1]`, `null`, ` null`, `1`, `"s"`, ``} {
		for _, stream := range []bool{false, true} {
			if _, err := PrepareBody([]byte(in), stream); err == nil {
				t.Errorf("PrepareBody(%q, %v) accepted a non-object body", in, stream)
			}
			if _, err := PrepareAnthropicBody([]byte(in), stream); err == nil {
				t.Errorf("PrepareAnthropicBody(%q, %v) accepted a non-object body", in, stream)
			}
		}
	}
}

func FuzzPrepareBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":false}`), true)
	f.Add([]byte(`{"stream_options":null}`), false)
	f.Add([]byte(`null`), true)
	f.Fuzz(func(t *testing.T, in []byte, stream bool) {
		if _, err := PrepareAnthropicBody(in, stream); err == nil && !json.Valid(in) {
			t.Fatalf("anthropic body accepted invalid JSON: %q", in)
		}
		out, err := PrepareBody(in, stream)
		if err != nil {
			return
		}
		var probe struct {
			Stream        *bool `json:"stream"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(out, &probe); err != nil {
			t.Fatalf("output not JSON: %q", out)
		}
		if stream && (probe.Stream == nil || !*probe.Stream || probe.StreamOptions == nil || !probe.StreamOptions.IncludeUsage) {
			t.Fatalf("stream body without stream+usage: %s", out)
		}
		if !stream && probe.Stream != nil && *probe.Stream {
			t.Fatalf("non-stream body streams: %s", out)
		}
	})
}

// FuzzProbeStream: probeStream reads what json.Unmarshal into a struct with the same two tagged
// fields reads (the reference it replaced), and fails exactly where that fails.
func FuzzProbeStream(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true}`, `{"STREAM":false,"stream":null}`, `{"str\u0065am":true}`,
		`{"stream":"yes"}`, `{"stream_options":{"include_usage":true},"Stream_Options":null}`, `[1]`, ` {"a":1} x`, `{"ſtream":true}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := probeStream(body)
		var want struct {
			Stream        *bool           `json:"stream"`
			StreamOptions json.RawMessage `json:"stream_options"`
		}
		werr := decodeObject(body, &want)
		if (err == nil) != (werr == nil) {
			t.Fatalf("probeStream error %v, encoding/json %v", err, werr)
		}
		if err != nil {
			return
		}
		if (got.Stream == nil) != (want.Stream == nil) || (got.Stream != nil && *got.Stream != *want.Stream) ||
			string(got.StreamOptions) != string(want.StreamOptions) {
			t.Fatalf("probeStream = %v %q, encoding/json %v %q", got.Stream, got.StreamOptions, want.Stream, want.StreamOptions)
		}
	})
}
