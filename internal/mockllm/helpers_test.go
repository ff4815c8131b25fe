package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is one way of reaching a Server: over a real loopback listener or
// through the in-memory RoundTripper.
type harness struct {
	srv    *Server
	client *http.Client
	base   string
}

type transportCase struct {
	name string
	new  func(t *testing.T, opts Options) *harness
}

var transports = []transportCase{
	{"httptest", func(t *testing.T, opts Options) *harness {
		s := New(opts)
		ts := httptest.NewServer(s) // listens on 127.0.0.1
		t.Cleanup(ts.Close)
		return &harness{srv: s, client: ts.Client(), base: ts.URL}
	}},
	{"roundtripper", func(t *testing.T, opts Options) *harness {
		s := New(opts)
		return &harness{srv: s, client: &http.Client{Transport: s.RoundTripper()}, base: "http://mockllm.invalid"}
	}},
}

// forEachTransport runs fn as a subtest per transport, each with a fresh Server.
func forEachTransport(t *testing.T, opts Options, fn func(t *testing.T, h *harness)) {
	t.Helper()
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) { fn(t, tc.new(t, opts)) })
	}
}

func (h *harness) doCtx(ctx context.Context, method, path, body string, hdr map[string]string) (*http.Response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return h.client.Do(req)
}

func (h *harness) do(t *testing.T, method, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	resp, err := h.doCtx(context.Background(), method, path, body, hdr)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// fetch performs a request and reads the whole body, which must succeed.
func (h *harness) fetch(t *testing.T, method, path, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp := h.do(t, method, path, body, hdr)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp, data
}

func (h *harness) chat(t *testing.T, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	return h.fetch(t, http.MethodPost, "/v1/chat/completions", body, hdr)
}

// settle waits until no chat request is in flight and returns the stats.
func settle(t *testing.T, s *Server) Stats {
	t.Helper()
	var st Stats
	testkit.CheckFor(t, 5*time.Second, 2*time.Millisecond, func() error {
		if st = s.Stats(); st.InFlight != 0 {
			return fmt.Errorf("requests still in flight: %+v", st)
		}
		return nil
	})
	return st
}

// chatReq builds a request body.
func chatReq(t *testing.T, fields map[string]any) string {
	t.Helper()
	m := map[string]any{
		"model": "oncegate-mock",
		"messages": []any{
			map[string]any{"role": "system", "content": "You are a helpful assistant."},
			map[string]any{"role": "user", "content": "Say hello to oncegate."},
		},
	}
	for k, v := range fields {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type wireChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

type wireCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

type wireError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decoding %q: %v", data, err)
	}
	return v
}

// sseFrames splits raw SSE bytes into the payloads of complete frames; a
// trailing incomplete frame is returned separately.
func sseFrames(t *testing.T, data []byte) (payloads []string, rest string) {
	t.Helper()
	s := string(data)
	for {
		i := strings.Index(s, "\n\n")
		if i < 0 {
			return payloads, s
		}
		frame := s[:i]
		s = s[i+2:]
		p, ok := strings.CutPrefix(frame, "data: ")
		if !ok {
			t.Fatalf("frame without data prefix: %q", frame)
		}
		payloads = append(payloads, p)
	}
}

// streamSummary classifies the frames of a stream.
type streamSummary struct {
	role      bool
	tokens    []string
	finish    string
	usage     *usage
	done      bool
	usageNull int // chunks carrying "usage":null
	noUsage   int // chunks without a usage key
}

func summarize(t *testing.T, payloads []string) streamSummary {
	t.Helper()
	var s streamSummary
	for i, p := range payloads {
		if p == "[DONE]" {
			if i != len(payloads)-1 {
				t.Fatalf("[DONE] is not last")
			}
			s.done = true
			continue
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(p), &raw); err != nil {
			t.Fatalf("chunk %q: %v", p, err)
		}
		if u, ok := raw["usage"]; !ok {
			s.noUsage++
		} else if string(u) == "null" {
			s.usageNull++
		}
		c := decode[wireChunk](t, []byte(p))
		if c.Object != "chat.completion.chunk" {
			t.Fatalf("object = %q", c.Object)
		}
		if len(c.Choices) == 0 {
			if c.Usage == nil {
				t.Fatalf("chunk without choices and usage: %s", p)
			}
			s.usage = c.Usage
			continue
		}
		ch := c.Choices[0]
		switch {
		case ch.Delta.Role != nil:
			if i != 0 || *ch.Delta.Role != "assistant" || ch.Delta.Content == nil || *ch.Delta.Content != "" {
				t.Fatalf("bad role chunk %d: %s", i, p)
			}
			s.role = true
		case ch.Delta.Content != nil:
			if ch.FinishReason != nil {
				t.Fatalf("token chunk with finish_reason: %s", p)
			}
			s.tokens = append(s.tokens, *ch.Delta.Content)
		case ch.FinishReason != nil:
			s.finish = *ch.FinishReason
		default:
			t.Fatalf("unexpected chunk: %s", p)
		}
	}
	return s
}

// readFrame reads one SSE frame payload from br.
func readFrame(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if _, err := br.ReadString('\n'); err != nil {
		return "", err
	}
	return strings.TrimPrefix(strings.TrimSuffix(line, "\n"), "data: "), nil
}
