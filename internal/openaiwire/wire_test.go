package openaiwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	testkit.Golden(t, filepath.Join("..", "..", "testdata", "openaiwire", name), got)
}

func readAll(t *testing.T, in string) ([]string, error) {
	t.Helper()
	var got []string
	err := ReadEvents(strings.NewReader(in), func(d []byte) error {
		got = append(got, string(d))
		return nil
	})
	return got, err
}

func TestReadEvents(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    []string
		wantErr error
	}{
		{"simple", "data: a\n\ndata: b\n\ndata: [DONE]\n\n", []string{"a", "b"}, nil},
		{"crlf", "data: a\r\n\r\ndata: [DONE]\r\n\r\n", []string{"a"}, nil},
		{"no space after colon", "data:a\n\ndata:[DONE]\n\n", []string{"a"}, nil},
		{"comments and other fields", ": ping\nevent: x\nid: 3\ndata: a\n\nretry: 10\n\ndata: [DONE]\n\n", []string{"a"}, nil},
		{"multi-line data", "data: a\ndata: b\n\ndata: [DONE]\n\n", []string{"a\nb"}, nil},
		{"done without trailing blank line", "data: a\n\ndata: [DONE]", []string{"a"}, nil},
		{"truncated", "data: a\n\ndata: b\n\n", []string{"a", "b"}, ErrTruncated},
		{"truncated mid event", "data: a\n\ndata: {\"par", []string{"a"}, ErrTruncated},
		{"empty", "", nil, ErrTruncated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(t, tc.in)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("events = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEventReaderLongLine(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // longer than the 32 KiB read buffer
	got, err := readAll(t, "data: "+long+"\n\ndata: [DONE]\n\n")
	if err != nil || len(got) != 1 || got[0] != long {
		t.Fatalf("long event: err %v, %d events", err, len(got))
	}
}

func TestEventReaderReadError(t *testing.T) {
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("data: a\n\n"), errReader{boom})
	_, err := readAll(t, "")
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("empty input: %v", err)
	}
	er := NewEventReader(r)
	if d, err := er.Next(); err != nil || string(d) != "a" {
		t.Fatalf("first event: %q %v", d, err)
	}
	if _, err := er.Next(); !errors.Is(err, boom) {
		t.Fatalf("read error not wrapped: %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestUsageOnly(t *testing.T) {
	cases := []struct {
		name string
		in   string
		ok   bool
	}{
		{"usage chunk", `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, true},
		{"content chunk with null usage", `{"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}`, false},
		{"vllm continuous usage on a content chunk", `{"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, false},
		{"malformed", `{"choices":[],"usage":{`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, ok := UsageOnly([]byte(tc.in))
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if ok && u.TotalTokens != 3 {
				t.Fatalf("usage = %+v", u)
			}
		})
	}
}

const streamFixture = "testdata/openaiwire/stream_tools.sse"

// TestAssembleGolden assembles a recorded stream (content, a tool call split over chunks, usage).
func TestAssembleGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", streamFixture))
	if err != nil {
		t.Fatal(err)
	}
	var events, usage []byte
	if err := ReadEvents(bytes.NewReader(raw), func(d []byte) error {
		if _, ok := UsageOnly(d); ok {
			usage = Frame(d)
			return nil
		}
		events = AppendFrame(events, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	body, err := Assemble(events, usage)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "assembled.json", append(body, '\n'))
	if !json.Valid(body) {
		t.Fatal("assembled body is not JSON")
	}
}

// TestSynthesizeRoundTrip: a completion turned into a stream and assembled back is the same.
func TestSynthesizeRoundTrip(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("..", "..", "testdata", "openaiwire", "assembled.json"))
	if err != nil {
		t.Fatal(err)
	}
	body = bytes.TrimSpace(body)
	events, usage, err := Synthesize(body)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "synthesized.sse", append(append(append([]byte{}, events...), usage...), DoneFrame...))
	back, err := Assemble(events, usage)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, body) {
		t.Fatalf("round trip differs:\n got %s\nwant %s", back, body)
	}
}

func TestAssembleRejectsGarbage(t *testing.T) {
	if _, err := Assemble([]byte("data: {not json}\n\n"), nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
	if _, _, err := Synthesize([]byte("[1,2]")); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
}

func TestErrorBody(t *testing.T) {
	got := string(ErrorBody("bad", "invalid_request_error", "code_x", ""))
	want := `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"code_x"}}`
	if got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}

func FuzzEventReader(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"total_tokens\":1}}\n\n"))
	f.Add([]byte(": c\r\nid: 1\r\ndata: x\r\ndata: y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n := 0
		err := ReadEvents(bytes.NewReader(in), func(d []byte) error {
			n++
			if bytes.Equal(d, doneData) {
				t.Fatal("[DONE] delivered as an event")
			}
			_, _ = UsageOnly(d)
			return nil
		})
		if err == nil && !bytes.Contains(in, doneData) {
			t.Fatal("nil error without [DONE] in the input")
		}
		if n > len(in) {
			t.Fatalf("%d events from %d bytes", n, len(in))
		}
		// Whatever parsed as frames must assemble or fail cleanly, never panic.
		_, _ = Assemble(in, nil)
		_, _, _ = Synthesize(in)
	})
}

// usageOfReference is UsageOf as it was: json.Unmarshal of the whole body into the probe.
func usageOfReference(body []byte) *Usage {
	var p usageProbe
	if json.Unmarshal(body, &p) != nil {
		return nil
	}
	return p.Usage
}

// usageCases are bodies UsageOf must read as json.Unmarshal does.
var usageCases = []string{
	`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
	`{"choices":[],"usage":null}`,
	`{"usage":{"prompt_tokens":1},"USAGE":{"prompt_tokens":2}}`, // the last match wins, in any case
	`{"usage":{"prompt_tokens":1},"usage":null}`,                // null after a value clears it
	`{"uſage":{"prompt_tokens":4}}`,                             // Unicode folding, as encoding/json
	`{"usage":{"prompt_tokens":1.5}}`,                           // not an int: the whole fails
	`{"usage":"none"}`,                                          // not an object
	`{"choices":5,"usage":{"prompt_tokens":1}}`,                 // choices not an array: the whole fails
	`{"Choices":null,"usage":{"total_tokens":7}}`,
	`{"usage":{"prompt_tokens":1,"prompt_tokens":9,"extra":[1,{"a":2}]}}`,
	`[{"usage":{"prompt_tokens":1}}]`,
	`null`,
	`{"usage":{"prompt_tokens":1}} trailing`,
	`{"usage":{"prompt_tokens":1e400}}`,
	"{\"usage\":{\"prompt_tokens\":1},\"s\":\"\xff\"}", // invalid UTF-8 in a string is still valid JSON
	``,
}

// TestUsageOf: UsageOf reads what json.Unmarshal into the probe reads, on bodies chosen for the
// ways a key can match and a member can fail.
func TestUsageOf(t *testing.T) {
	for _, body := range usageCases {
		got, want := UsageOf([]byte(body)), usageOfReference([]byte(body))
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Errorf("UsageOf(%q) = %+v, want %+v", body, got, want)
		}
	}
}

// FuzzUsageOf: UsageOf agrees with json.Unmarshal into the probe on any input.
func FuzzUsageOf(f *testing.F) {
	for _, body := range usageCases {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, want := UsageOf(body), usageOfReference(body)
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Fatalf("UsageOf(%q) = %+v, want %+v", body, got, want)
		}
	})
}

// BenchmarkUsageOf: a non-stream answer of the mock (16 tokens), read by UsageOf and by the
// reference (json.Unmarshal of the whole body).
func BenchmarkUsageOf(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-0b7a2c","object":"chat.completion","created":1764806400,"model":"oncegate-mock",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("token ", 16) + `"},` +
		`"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28},` +
		`"system_fingerprint":"fp_oncegate"}`)
	for _, bc := range []struct {
		name string
		fn   func([]byte) *Usage
	}{{"scan", UsageOf}, {"unmarshal", usageOfReference}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.fn(body) == nil {
					b.Fatal("no usage")
				}
			}
		})
	}
}
