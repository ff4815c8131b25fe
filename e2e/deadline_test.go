package e2e

// Oncegate-Timeout is the client's deadline, not the intent's outcome: when it passes, that
// client gets a 504 that is not stored; the execution goes on for the other copies, or, when it
// never reached a backend, the key is released.

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// dlGated is an upstream that holds every request whose first message starts with "hold:"
// until release is called (or the gateway gives the request up).
func dlGated(t *testing.T) (*upstream, func()) {
	t.Helper()
	gate := make(chan struct{})
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte, h hit) bool {
		if !strings.HasPrefix(h.intent, "hold:") {
			return false
		}
		select {
		case <-gate:
			return false
		case <-r.Context().Done():
			return true
		}
	})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the upstream closes (cleanups run last first)
	return up, release
}

func dlGateway(t *testing.T, up *upstream, concurrency int) *gatewaykit.Gateway {
	t.Helper()
	cfg := gatewaykit.Config(t)
	cfg.Workers.Concurrency = concurrency
	cfg.Backends = append(cfg.Backends, fastRetryBackend("up", config.TypeOpenAI, up.base(), "oncegate-mock"))
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"up"}}}
	return gatewaykit.StartGateway(t, cfg)
}

func dlIntentHits(up *upstream, intent string) int {
	n := 0
	for _, h := range up.Hits() {
		if h.intent == intent {
			n++
		}
	}
	return n
}

// dlAssertDeadline504: the client whose deadline passed got the gateway's own 504, which tells
// it not to re-send at once.
func dlAssertDeadline504(t *testing.T, resp result) {
	t.Helper()
	if resp.Status != http.StatusGatewayTimeout || resp.Header.Get("x-should-retry") != "false" {
		t.Fatalf("status %d x-should-retry %q, want the gateway's 504: %s", resp.Status, resp.Header.Get("x-should-retry"), resp.Body)
	}
	assertOpenAIError(t, resp, "deadline_exceeded")
}

// TestClientDeadlineExecutionGoesOn: the deadline passes while the backend works. The client
// gets a 504 that is not stored; the execution goes on, a copy with the same key gets its
// answer, the record ends COMPLETED, and the backend ran once.
func TestClientDeadlineExecutionGoesOn(t *testing.T) {
	up, release := dlGated(t)
	gw := dlGateway(t, up, 4)
	const msg, key = "hold: the client stops waiting, the execution does not", "dl-goes-on"
	body := chatBody("oncegate-mock", msg, "")
	want := directMock(t, body)

	for _, tc := range []struct {
		name, body string
	}{{"non-stream", body}, {"stream", chatBody("oncegate-mock", msg, `"stream":true`)}} {
		t.Run(tc.name, func(t *testing.T) {
			resp := postChat(t, gw.URL, tc.body, map[string]string{"Idempotency-Key": key, "Oncegate-Timeout": "0.2"})
			dlAssertDeadline504(t, resp)
		})
	}
	if st := idemStatus(t, gw.URL, key, nil); st["state"] != "PENDING" {
		t.Fatalf("after the client's deadline: state %v, want the execution still PENDING", st["state"])
	}
	release()
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	b := resp.Body
	if o := resp.Header.Get("Oncegate-Idempotency"); resp.Status != http.StatusOK || (o != "joined" && o != "replayed") {
		t.Fatalf("copy after the deadline: %d %s: %s", resp.Status, o, b)
	}
	if !bytes.Equal(b, want) {
		t.Errorf("copy after the deadline got %s\nwant the backend's answer %s", b, want)
	}
	if st := idemStatus(t, gw.URL, key, nil); st["state"] != "COMPLETED" || st["status"] != float64(200) {
		t.Errorf("record state %v status %v, want COMPLETED 200", st["state"], st["status"])
	}
	if n := dlIntentHits(up, msg); n != 1 {
		t.Errorf("backend executions %d, want 1", n)
	}
}

// TestClientDeadlineBeforeBackendReleasesKey: the deadline passes while the job waits for a
// worker (the only one is busy). The client gets a 504; the job never reaches the backend and
// the key is released, so a later request with it executes.
func TestClientDeadlineBeforeBackendReleasesKey(t *testing.T) {
	up, release := dlGated(t)
	gw := dlGateway(t, up, 1)
	const blocker = "hold: the only worker is busy with this"
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r := send(http.MethodPost, gw.URL+chatPath, chatBody("oncegate-mock", blocker, ""), nil); r.Status != http.StatusOK {
			t.Errorf("blocker: %d %v %s", r.Status, r.Err, r.Body)
		}
	}()
	defer func() { release(); <-done }()
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if n := dlIntentHits(up, blocker); n != 1 {
			return fmt.Errorf("the blocker reached the backend %d times, want 1", n)
		}
		return nil
	})

	const msg, key = "queued past the client's deadline", "dl-released"
	body := chatBody("oncegate-mock", msg, "")
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key, "Oncegate-Timeout": "0.2"})
	b := resp.Body
	dlAssertDeadline504(t, resp)
	release()
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if st := idemStatus(t, gw.URL, key, nil)["state"]; st != "FAILED" {
			return fmt.Errorf("the key is not released: state %v", st)
		}
		return nil
	})
	if n := dlIntentHits(up, msg); n != 0 {
		t.Fatalf("backend executions %d before the retry, want 0 (the deadline had passed)", n)
	}
	resp = postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	b = resp.Body
	if resp.Status != http.StatusOK || !bytes.Equal(b, directMock(t, body)) {
		t.Fatalf("retry with the key: %d %s", resp.Status, b)
	}
	if n := dlIntentHits(up, msg); n != 1 {
		t.Errorf("backend executions %d after the retry, want 1", n)
	}
}
