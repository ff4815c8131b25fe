package anthropicwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	testkit.Golden(t, filepath.Join("..", "..", "testdata", "anthropicwire", name), got)
}

// TestAssembleRecordedStream assembles the streamed tool-use example of the Messages API
// documentation: text, a tool call whose input arrives in pieces, cumulative usage.
func TestAssembleRecordedStream(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "anthropicwire", "stream_tools.sse"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := Assemble(raw)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "assembled.json", append(body, '\n'))
	var m struct {
		Content []map[string]any `json:"content"`
		Usage   map[string]any   `json:"usage"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Content) != 2 || m.Content[1]["input"].(map[string]any)["location"] != "San Francisco, CA" {
		t.Fatalf("content = %v", m.Content)
	}
	if m.Usage["input_tokens"].(float64) != 472 || m.Usage["output_tokens"].(float64) != 89 {
		t.Fatalf("usage = %v (output tokens are cumulative: the last message_delta wins)", m.Usage)
	}
}

// TestSynthesizeRoundTrip: a message turned into events and assembled back is the same.
func TestSynthesizeRoundTrip(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("..", "..", "testdata", "anthropicwire", "assembled.json"))
	if err != nil {
		t.Fatal(err)
	}
	body = bytes.TrimSpace(body)
	events, err := Synthesize(body)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "synthesized.sse", events)
	back, err := Assemble(events)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, body) {
		t.Fatalf("round trip differs:\n got %s\nwant %s", back, body)
	}
}

func TestErrors(t *testing.T) {
	if got := string(ErrorBody("rate_limit_error", "slow down")); got != `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}` {
		t.Fatal(got)
	}
	for status, want := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"} {
		if got := ErrorType(status); got != want {
			t.Errorf("ErrorType(%d) = %s, want %s", status, got, want)
		}
	}
	if _, err := Assemble([]byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{}}\n\n")); !errors.Is(err, ErrMalformed) {
		t.Fatalf("delta before start: %v", err)
	}
	if _, err := Synthesize([]byte(`[]`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("synthesize array: %v", err)
	}
}

func FuzzAssemble(f *testing.F) {
	raw, _ := os.ReadFile(filepath.Join("..", "..", "testdata", "anthropicwire", "stream_tools.sse"))
	f.Add(raw)
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		body, err := Assemble(in)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("assembled invalid JSON: %s", body)
		}
		if _, err := Synthesize(body); err != nil {
			t.Fatalf("cannot synthesize an assembled message: %v", err)
		}
	})
}
