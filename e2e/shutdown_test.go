package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// directGateway starts a gateway with gateway.Start, not gatewaykit: the test calls Stop itself.
// A cleanup stops it only if the test ended before doing so.
func directGateway(t *testing.T, cfg *config.Config) (gw *gateway.Gateway, stop func(context.Context) error) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := gateway.Start(ctx, cfg, zerolog.Nop(), func(string) string { return "" })
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var stopped atomic.Bool
	stop = func(ctx context.Context) error {
		stopped.Store(true)
		return gw.Stop(ctx)
	}
	t.Cleanup(func() {
		if !stopped.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_ = gw.Stop(ctx)
		}
	})
	return gw, stop
}

// listenerClosed reports whether addr refuses new connections.
func listenerClosed(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// TestShutdown stops a gateway with requests in flight: they finish (bounded by
// shutdown_grace), nothing new is accepted, and after Stop no goroutine is left.
func TestShutdown(t *testing.T) {
	// Goroutines that were there before (other tests' leftovers still winding down) are not
	// this test's business; TestMain checks the whole package.
	ignoreBefore := goleak.IgnoreCurrent()
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{}}

	t.Run("in-flight stream completes", func(t *testing.T) {
		cfg := gatewaykit.Config(t)
		cfg.HTTP.ShutdownGrace = config.Duration(20 * time.Second)
		gw, stop := directGateway(t, cfg)
		addr := gw.Addr()
		const tokens = 40 // 40 × 20 ms: still streaming well after Stop begins
		body := chatBody("oncegate-mock-slow", "shutdown stream", `"stream":true,"mock":{"tokens":40}`)
		want := parseCompletion(t, directMock(t, chatBody("oncegate-mock-slow", "shutdown stream", `"mock":{"tokens":40}`)))

		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+chatPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var readErr error
		frames := sseFrames(resp.Body, &readErr)
		var data []string
		// wait for the first token: the stream is in flight
		for len(data) < 2 {
			f, ok := <-frames
			if !ok {
				t.Fatalf("stream ended before its first token: %v", readErr)
			}
			data = append(data, f)
		}

		stopErr := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stopErr <- stop(ctx)
		}()
		testkit.CheckFor(t, 5*time.Second, pollEvery, func() error {
			if !listenerClosed(addr) {
				return errors.New("the listener still accepts after Stop began")
			}
			return nil
		})
		afterClose := 0
		for f := range frames {
			data = append(data, f)
			afterClose++
		}
		if readErr != nil {
			t.Fatalf("stream read error: %v", readErr)
		}
		if afterClose == 0 {
			t.Errorf("no frame arrived after the listener closed: the stream was not in flight during shutdown")
		}
		st, err := chatTranscript(data)
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		id, content, done := st.ID, st.Content, st.Done
		if !done {
			t.Fatalf("the in-flight stream did not end with [DONE]; last event %q", data[len(data)-1])
		}
		if id != want.ID || content != want.Choices[0].Message.Content {
			t.Errorf("stream content %q (id %s), want %q (id %s)", content, id, want.Choices[0].Message.Content, want.ID)
		}
		if n := strings.Count(content, " ") + 1; n != tokens {
			t.Errorf("%d tokens, want %d", n, tokens)
		}
		if err := <-stopErr; err != nil {
			t.Errorf("Stop: %v", err)
		}
		if _, err := client.Post("http://"+addr+chatPath, "application/json", strings.NewReader(chatBody("oncegate-mock", "after stop", ""))); err == nil {
			t.Errorf("a request after Stop was served")
		}
	})

	t.Run("in-flight non-stream completes", func(t *testing.T) {
		cfg := gatewaykit.Config(t)
		cfg.HTTP.ShutdownGrace = config.Duration(20 * time.Second)
		gw, stop := directGateway(t, cfg)
		backend, _ := gw.Backend("slowmock")
		slow := backend.Mock()
		body := chatBody("oncegate-mock-slow", "shutdown non-stream", `"mock":{"tokens":40}`)
		want := directMock(t, body)

		type result struct {
			status int
			b      []byte
			err    error
		}
		got := make(chan result, 1)
		go func() {
			resp, err := client.Post("http://"+gw.Addr()+chatPath, "application/json", strings.NewReader(body))
			if err != nil {
				got <- result{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			got <- result{status: resp.StatusCode, b: b, err: err}
		}()
		testkit.CheckFor(t, 10*time.Second, pollEvery, inFlight(slow, 1))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
		r := <-got
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("in-flight request: status %d err %v body %s", r.status, r.err, r.b)
		}
		if g, w := parseCompletion(t, r.b), parseCompletion(t, want); g.ID != w.ID || g.Choices[0].Message.Content != w.Choices[0].Message.Content {
			t.Errorf("answer %s, want %s", r.b, want)
		}
		if n := slow.Stats(); n.Requests != 1 || n.Completed != 1 || n.InFlight != 0 {
			t.Errorf("backend stats after Stop = %+v, want one completed execution", n)
		}
	})

	// A stream that outlives shutdown_grace is ended with an explicit error event, never a
	// silent end or a hang, and Stop returns.
	t.Run("stream longer than the grace is ended explicitly", func(t *testing.T) {
		cfg := gatewaykit.Config(t)
		cfg.HTTP.ShutdownGrace = config.Duration(200 * time.Millisecond)
		gw, stop := directGateway(t, cfg)
		body := chatBody("oncegate-mock-slow", "shutdown grace", `"stream":true,"mock":{"tokens":1000}`)
		req, _ := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+chatPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var readErr error
		frames := sseFrames(resp.Body, &readErr)
		var data []string
		for len(data) < 2 {
			f, ok := <-frames
			if !ok {
				t.Fatalf("stream ended before its first token: %v", readErr)
			}
			data = append(data, f)
		}
		stopErr := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stopErr <- stop(ctx)
		}()
		for f := range frames {
			data = append(data, f)
		}
		select {
		case err := <-stopErr:
			t.Logf("Stop: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatalf("Stop did not return within 20 s of a 200 ms grace")
		}
		last := data[len(data)-1]
		if last == "[DONE]" {
			t.Fatalf("a 20 s stream completed within a 200 ms grace (%d events): the test did not test the grace", len(data))
		}
		if readErr == nil {
			var e openAIError
			if err := json.Unmarshal([]byte(last), &e); err != nil || e.Error == nil || e.Error.Code == nil ||
				*e.Error.Code != "stream_interrupted" || e.Error.Message == nil || *e.Error.Message == "" {
				t.Errorf("stream cut by shutdown ended with %q, want an OpenAI error event (stream_interrupted)", last)
			}
		} else {
			t.Errorf("stream cut by shutdown ended with a read error %v (last event %q), want an error event", readErr, last)
		}
		if m, _ := gw.Backend("slowmock"); m.Mock().Stats().InFlight != 0 {
			t.Errorf("the backend call is still running after Stop")
		}
	})

	client.CloseIdleConnections()
	waitFasthttpCleaners(15 * time.Second)
	goleak.VerifyNone(t, append(leakOptions(), ignoreBefore)...)
}
