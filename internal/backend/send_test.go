package backend

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
)

// stallingServer reads each request and answers nothing until the client gives up or the test
// ends.
func stallingServer(t *testing.T) *httptest.Server {
	t.Helper()
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv
}

func testClient(t *testing.T, baseURL string, honors bool) *Client {
	t.Helper()
	c, err := New(config.Backend{Name: "b", Type: config.TypeOpenAI, BaseURL: baseURL,
		Timeout: config.Duration(400 * time.Millisecond), FirstByteTimeout: config.Duration(50 * time.Millisecond),
		HonorsIdempotencyKey: honors}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSilentBackend: a written call that gets no first byte becomes re-sendable only when the
// backend deduplicates the key it is sent with; any other waits its total timeout and is
// ambiguous (the backend may be running it).
func TestSilentBackend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		honors  bool
		key     string
		want    error
		atLeast time.Duration
	}{
		{name: "deduplicating backend, key sent", honors: true, key: "k1", want: ErrResendSafe},
		{name: "deduplicating backend, no key", honors: true, want: ErrAmbiguous, atLeast: 400 * time.Millisecond},
		{name: "plain backend, key sent", key: "k1", want: ErrAmbiguous, atLeast: 400 * time.Millisecond},
		{name: "plain backend, no key", want: ErrAmbiguous, atLeast: 400 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testClient(t, stallingServer(t).URL, tc.honors)
			start := time.Now()
			resp, cancel, err := c.Send(context.Background(), &Call{API: APIOpenAI, Path: "/chat/completions", Body: []byte(`{}`), IdemKey: tc.key})
			if err == nil {
				resp.Body.Close()
				cancel()
				t.Fatal("Send answered a backend that never did")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Send: %v, want %v", err, tc.want)
			}
			if elapsed := time.Since(start); elapsed < tc.atLeast {
				t.Fatalf("Send gave up after %v, before the total timeout %v", elapsed, tc.atLeast)
			}
		})
	}
}

// TestSendRefused: a call whose connection is refused was never sent.
func TestSendRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	for _, honors := range []bool{false, true} {
		_, _, err := testClient(t, url, honors).Send(context.Background(), &Call{API: APIOpenAI, Path: "/chat/completions", Body: []byte(`{}`), IdemKey: "k1"})
		if !errors.Is(err, ErrNotSent) {
			t.Fatalf("honors=%v: Send to a closed port: %v, want ErrNotSent", honors, err)
		}
	}
}

// BenchmarkSend is one non-stream call to a loopback backend that answers at once, with the
// client's per-call work (contexts, trace hooks, the first-byte watch where there is one).
func BenchmarkSend(b *testing.B) {
	answer := []byte(`{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	for _, honors := range []bool{false, true} {
		name := "plain"
		if honors {
			name = "deduplicating"
		}
		b.Run(name, func(b *testing.B) {
			c, err := New(config.Backend{Name: "b", Type: config.TypeOpenAI, BaseURL: srv.URL, HonorsIdempotencyKey: honors}, nil)
			if err != nil {
				b.Fatal(err)
			}
			call := &Call{API: APIOpenAI, Path: "/chat/completions", Body: []byte(`{"model":"m"}`), IdemKey: "k1"}
			b.ReportAllocs()
			for b.Loop() {
				resp, cancel, err := c.Send(context.Background(), call)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				cancel()
			}
		})
	}
}
