package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestStall(t *testing.T) {
	for _, stream := range []bool{false, true} {
		forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
			body := chatReq(t, map[string]any{"stream": stream})
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			resp, err := h.doCtx(ctx, http.MethodPost, "/v1/chat/completions", body, map[string]string{"X-Mock-Fault": "stall"})
			if err == nil {
				resp.Body.Close()
				t.Fatalf("stall returned a response: %d", resp.StatusCode)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want deadline exceeded", err)
			}
			if d := time.Since(start); d < 150*time.Millisecond {
				t.Errorf("returned after %v", d)
			}
			// The handler must notice the cancellation and return.
			if st := settle(t, h.srv); st != (Stats{Requests: 1, Faults: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestDropAfter(t *testing.T) {
	tests := []struct {
		name       string
		fields     map[string]any
		hdr        map[string]string
		wantTokens int
	}{
		{"after 3 via body", map[string]any{"mock": map[string]any{"fault": "drop_after", "fault_after": 3}}, nil, 3},
		{"after 5 via header", nil, map[string]string{"X-Mock-Fault": "drop_after", "X-Mock-Fault-After": "5"}, 5},
		{"header wins", map[string]any{"mock": map[string]any{"fault": "drop_after", "fault_after": 9}}, map[string]string{"X-Mock-Fault-After": "1"}, 1},
		{"after 0", map[string]any{"mock": map[string]any{"fault": "drop_after"}}, nil, 0},
		{"after all tokens", map[string]any{"max_tokens": 4, "mock": map[string]any{"fault": "drop_after", "fault_after": 10}}, nil, 4},
		{"with delays", map[string]any{"mock": map[string]any{"fault": "drop_after", "fault_after": 2, "ttft_ms": 10, "inter_token_ms": 10}}, nil, 2},
	}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				h.srv.Reset()
				fields := map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}
				for k, v := range tt.fields {
					fields[k] = v
				}
				resp := h.do(t, http.MethodPost, "/v1/chat/completions", chatReq(t, fields), tt.hdr)
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				data, err := io.ReadAll(resp.Body)
				if err == nil || errors.Is(err, io.EOF) {
					t.Fatalf("truncated stream read ended with %v, want an error", err)
				}
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Logf("read error: %v", err) // any non-EOF error is acceptable
				}
				payloads, rest := sseFrames(t, data)
				if rest != "" {
					t.Errorf("partial frame %q", rest)
				}
				s := summarize(t, payloads)
				if !s.role || len(s.tokens) != tt.wantTokens || s.done || s.finish != "" || s.usage != nil {
					t.Errorf("got role=%v tokens=%d done=%v finish=%q, want %d tokens and no end",
						s.role, len(s.tokens), s.done, s.finish, tt.wantTokens)
				}
				if st := settle(t, h.srv); st != (Stats{Requests: 1, Faults: 1}) {
					t.Errorf("stats %+v", st)
				}
			})
		}
		t.Run("non-stream", func(t *testing.T) {
			h.srv.Reset()
			resp := h.do(t, http.MethodPost, "/v1/chat/completions", chatReq(t, nil), map[string]string{"X-Mock-Fault": "drop_after"})
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			data, err := io.ReadAll(resp.Body)
			if err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("read ended with %v, want an error", err)
			}
			if len(data) == 0 || int64(len(data)) >= resp.ContentLength {
				t.Errorf("got %d of %d bytes", len(data), resp.ContentLength)
			}
			if st := settle(t, h.srv); st != (Stats{Requests: 1, Faults: 1}) {
				t.Errorf("stats %+v", st)
			}
		})
	})
}

// streamingRT starts a slow stream over the RoundTripper and reads the role
// chunk and the first token.
func streamingRT(t *testing.T, ctx context.Context) (*Server, *http.Response, *bufio.Reader) {
	t.Helper()
	s := New(Options{InterToken: 20 * time.Millisecond, Tokens: 1000})
	c := &http.Client{Transport: s.RoundTripper()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mock/v1/chat/completions",
		strings.NewReader(chatReq(t, map[string]any{"stream": true})))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 2; i++ {
		if _, err := readFrame(br); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	if st := s.Stats(); st.InFlight != 1 {
		t.Fatalf("stats %+v", st)
	}
	return s, resp, br
}

func TestRoundTripperCancelMidStream(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, resp, br := streamingRT(t, ctx)
	cancel()
	var err error
	for i := 0; i < 10 && err == nil; i++ { // at most the frame in transit
		_, err = readFrame(br)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("read after cancel: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	if st := s.Stats(); st != (Stats{Requests: 1}) {
		t.Errorf("stats %+v", st)
	}
	goleak.VerifyNone(t)
}

func TestRoundTripperBodyCloseStopsHandler(t *testing.T) {
	s, resp, _ := streamingRT(t, context.Background())
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waits for the handler: nothing is in flight any more.
	if st := s.Stats(); st != (Stats{Requests: 1}) {
		t.Errorf("stats right after Close: %+v", st)
	}
	if n, err := resp.Body.Read(make([]byte, 10)); n != 0 || err == nil || errors.Is(err, io.EOF) {
		t.Errorf("read after close: %d, %v", n, err)
	}
	goleak.VerifyNone(t)
}

func TestRoundTripperCancelBeforeHeaders(t *testing.T) {
	s := New(Options{TTFT: time.Hour})
	c := &http.Client{Transport: s.RoundTripper()}
	for _, stream := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://mock/v1/chat/completions",
			strings.NewReader(chatReq(t, map[string]any{"stream": stream})))
		start := time.Now()
		resp, err := c.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatal("expected an error")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
		// RoundTrip waited for the handler.
		if st := s.Stats(); st.InFlight != 0 {
			t.Errorf("stats %+v", st)
		}
	}
	goleak.VerifyNone(t)
}

func TestRoundTripperFullReadLeavesNothing(t *testing.T) {
	s := New(Options{})
	c := &http.Client{Transport: s.RoundTripper()}
	for _, stream := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPost, "http://mock/v1/chat/completions",
			strings.NewReader(chatReq(t, map[string]any{"stream": stream})))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		// EOF is only delivered once the handler has returned.
		if st := s.Stats(); st.InFlight != 0 {
			t.Errorf("in flight after EOF: %+v", st)
		}
		resp.Body.Close()
	}
	if st := s.Stats(); st != (Stats{Requests: 2, Completed: 2}) {
		t.Errorf("stats %+v", st)
	}
	goleak.VerifyNone(t)
}

// handlerFunc exercises the transport with arbitrary handlers.
func TestTransportHandlerEdges(t *testing.T) {
	tests := []struct {
		name    string
		h       http.HandlerFunc
		status  int
		body    string
		wantErr bool // RoundTrip error
		readErr bool // body read error
	}{
		{"no write", func(w http.ResponseWriter, r *http.Request) {}, 200, "", false, false},
		{"status only", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }, 204, "", false, false},
		{"sniffed", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") }, 200, "hello", false, false},
		{"abort before headers", func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) }, 0, "", true, false},
		{"panic after write", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "part")
			panic("boom")
		}, 200, "part", false, true},
		{"echo body", func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(w, r.Body) }, 200, "ping", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &http.Client{Transport: &transport{h: tt.h}}
			resp, err := c.Post("http://x/", "text/plain", strings.NewReader("ping"))
			if tt.wantErr {
				if err == nil {
					resp.Body.Close()
					t.Fatal("want error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if (err != nil) != tt.readErr {
				t.Errorf("read err %v", err)
			}
			if resp.StatusCode != tt.status || string(data) != tt.body {
				t.Errorf("%d %q", resp.StatusCode, data)
			}
			if tt.name == "sniffed" && resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
			}
		})
	}
	goleak.VerifyNone(t)
}

// TestDropStart: the status line and headers go out, then the connection is aborted before
// any event (stream) or body byte (non-stream).
func TestDropStart(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
				h.srv.Reset()
				resp := h.do(t, http.MethodPost, "/v1/chat/completions", chatReq(t, map[string]any{"stream": stream}), map[string]string{"X-Mock-Fault": "drop_start"})
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				data, err := io.ReadAll(resp.Body)
				if err == nil || errors.Is(err, io.EOF) || len(data) != 0 {
					t.Fatalf("read %q ended with %v, want no byte and an error", data, err)
				}
				if st := settle(t, h.srv); st != (Stats{Requests: 1, Faults: 1}) {
					t.Errorf("stats %+v", st)
				}
			})
		}
	})
}

// TestErrorEventAfter: error_event_after sends fault_after tokens, then the API's in-stream
// error event, then ends cleanly: Chat Completions the error chunk and [DONE] (as vLLM does),
// Messages an error event and the end of the body (as Anthropic does). The bytes before the
// error are the clean stream's. With fault_first_n the next request of the scope succeeds;
// a non-stream request is answered normally.
func TestErrorEventAfter(t *testing.T) {
	const (
		chatError = "data: {\"error\":{\"message\":\"mock in-stream error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n"
		msgError  = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	)
	// frames is the first n SSE frames of a stream.
	frames := func(body []byte, n int) string {
		parts := strings.SplitAfter(string(body), "\n\n")
		return strings.Join(parts[:n], "")
	}
	knobs := map[string]any{"fault": "error_event_after", "fault_after": 3, "fault_first_n": 1}
	tests := []struct {
		name, path string
		body       func(mock map[string]any) string
		before     int // the clean stream's frames before the error: its opening ones and 3 tokens
		tail       string
	}{
		{"chat", "/v1/chat/completions", func(mock map[string]any) string {
			return chatReq(t, map[string]any{"stream": true, "mock": mock})
		}, 4, chatError},
		{"messages", "/v1/messages", func(mock map[string]any) string {
			m := map[string]any{"model": defaultModel, "max_tokens": 8, "stream": true,
				"messages": []any{map[string]any{"role": "user", "content": "Say hello to oncegate."}}}
			if mock != nil {
				m["mock"] = mock
			}
			b, _ := json.Marshal(m)
			return string(b)
		}, 5, msgError},
	}
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				h.srv.Reset()
				_, clean := h.fetch(t, http.MethodPost, tt.path, tt.body(nil), nil)
				resp, got := h.fetch(t, http.MethodPost, tt.path, tt.body(knobs), nil)
				if want := frames(clean, tt.before) + tt.tail; resp.StatusCode != http.StatusOK || string(got) != want {
					t.Fatalf("status %d, stream:\n%q\nwant:\n%q", resp.StatusCode, got, want)
				}
				if _, again := h.fetch(t, http.MethodPost, tt.path, tt.body(knobs), nil); string(again) != string(clean) {
					t.Errorf("after fault_first_n: %q\nwant the clean stream %q", again, clean)
				}
				if st := settle(t, h.srv); st.Faults != 1 {
					t.Errorf("stats %+v, want one fault", st)
				}
			})
		}
		t.Run("non-stream", func(t *testing.T) {
			h.srv.Reset()
			_, clean := h.fetch(t, http.MethodPost, "/v1/chat/completions", chatReq(t, nil), nil)
			_, got := h.fetch(t, http.MethodPost, "/v1/chat/completions", chatReq(t, map[string]any{"mock": knobs}), nil)
			if string(got) != string(clean) {
				t.Errorf("non-stream answer %s, want %s", got, clean)
			}
			if st := settle(t, h.srv); st.Faults != 0 {
				t.Errorf("stats %+v, want no fault", st)
			}
		})
	})
}
