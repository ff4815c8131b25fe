package backend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// decodeObject unmarshals body into v after checking that it is a JSON object.
func decodeObject(body []byte, v any) error {
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		return ErrBodyNotObject
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("backend: request body: %w", err)
	}
	return nil
}

// referencePrepare is prepareStream as it was before jsonscan: a probe and, when the body must
// change, a decode into a map and an encode.
func referencePrepare(body []byte, stream, openAI bool) ([]byte, error) {
	var probe struct {
		Stream        *bool           `json:"stream"`
		StreamOptions json.RawMessage `json:"stream_options"`
	}
	if err := decodeObject(body, &probe); err != nil {
		return nil, err
	}
	var options map[string]json.RawMessage
	if openAI && len(probe.StreamOptions) > 0 {
		if err := json.Unmarshal(probe.StreamOptions, &options); err != nil {
			return nil, err
		}
	}
	streamOK := (probe.Stream != nil && *probe.Stream == stream) || (probe.Stream == nil && !stream)
	usageOK := !openAI || (stream && string(options["include_usage"]) == "true") || (!stream && options == nil)
	if streamOK && usageOK {
		return body, nil
	}
	var full map[string]json.RawMessage
	if err := decodeObject(body, &full); err != nil {
		return nil, err
	}
	switch {
	case stream:
		full["stream"] = json.RawMessage("true")
		if openAI {
			if options == nil {
				options = map[string]json.RawMessage{}
			}
			options["include_usage"] = json.RawMessage("true")
			full["stream_options"], _ = json.Marshal(options)
		}
	default:
		delete(full, "stream")
		if openAI {
			delete(full, "stream_options")
		}
	}
	return json.Marshal(full)
}

// decodeNumbers decodes a JSON document keeping each number as its text (json.Number): both
// sides pass numbers through as they are, and one beyond float64's range is still valid JSON
// (into a float64 it would fail the decode, not the comparison).
func decodeNumbers(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("trailing data")
	}
	return v, nil
}

// FuzzPrepareMatchesReference: prepareStream gives the same JSON document as the reference
// (member order and spacing aside), or fails where it fails.
func FuzzPrepareMatchesReference(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `{"model":"m","stream":true}`,
		`{"a":1,"a":2,"stream":false,"stream_options":{"x":1}}`, `{"\u0061":1,"a":2}`, `{"stream_options":5}`, `{"Stream":true}`, `{}`} {
		f.Add([]byte(s), true, true)
		f.Add([]byte(s), false, true)
		f.Add([]byte(s), true, false)
	}
	f.Fuzz(func(t *testing.T, body []byte, stream, openAI bool) {
		got, err := prepareStream(body, stream, openAI)
		want, werr := referencePrepare(body, stream, openAI)
		if (err == nil) != (werr == nil) {
			t.Fatalf("error %v, reference %v", err, werr)
		}
		if err != nil {
			return
		}
		g, gerr := decodeNumbers(got)
		if gerr != nil {
			t.Fatalf("output not JSON: %q", got)
		}
		w, werr := decodeNumbers(want)
		if werr != nil {
			t.Fatalf("reference output not JSON: %q", want)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("output %s\nreference %s", got, want)
		}
	})
}
