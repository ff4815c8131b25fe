package e2e

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestSplitRoles runs the real binary as two processes sharing one NATS: a worker-only
// process that owns the embedded NATS server (listening on a port), and an API-only process
// connected to it. A request through the API is executed by the other process's workers,
// and both exit cleanly on SIGTERM.
func TestSplitRoles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the oncegate binary")
	}
	dir := t.TempDir()
	bin := oncegateBinary(t)

	natsAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	worker := startProc(t, "worker", bin, "serve", "--role", "worker",
		"--data-dir", filepath.Join(dir, "worker-data"), "--nats-listen", natsAddr)
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if worker.exited() {
			t.Fatalf("worker exited early: %v", worker.err)
		}
		c, err := net.DialTimeout("tcp", natsAddr, time.Second)
		if err != nil {
			return fmt.Errorf("the worker's embedded NATS does not listen on %s: %w", natsAddr, err)
		}
		c.Close()
		return nil
	})

	api := startProc(t, "api", bin, "serve", "--role", "api", "--nats-url", "nats://"+natsAddr,
		"--listen", httpAddr, "--data-dir", filepath.Join(dir, "api-data"))
	base := "http://" + httpAddr
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if api.exited() {
			t.Fatalf("api exited early: %v", api.err)
		}
		resp, err := httpClient.Get(base + "/readyz")
		if err != nil {
			return fmt.Errorf("the api process is not ready: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the api process is not ready: /readyz %d", resp.StatusCode)
		}
		return nil
	})

	t.Run("non-stream through the api process", func(t *testing.T) {
		body := chatBody("oncegate-mock", "split roles", "")
		want := parseCompletion(t, directMock(t, body))
		hdr := map[string]string{"Idempotency-Key": "split-roles-1"}
		resp := postChat(t, base, body, hdr)
		b := resp.Body
		if resp.Status != http.StatusOK {
			t.Fatalf("status %d body %s", resp.Status, b)
		}
		got := parseCompletion(t, b)
		if got.ID != want.ID || got.Choices[0].Message.Content != want.Choices[0].Message.Content {
			t.Errorf("answer %s, want id %s content %q", b, want.ID, want.Choices[0].Message.Content)
		}
		if o := resp.Header.Get("Oncegate-Idempotency"); o != "created" {
			t.Errorf("Oncegate-Idempotency = %q, want created", o)
		}
		// the record is shared through NATS: the same key again is a replay
		resp2 := postChat(t, base, body, hdr)
		b2 := resp2.Body
		if resp2.Status != http.StatusOK || resp2.Header.Get("Oncegate-Idempotency") != "replayed" {
			t.Errorf("second copy: status %d outcome %q", resp2.Status, resp2.Header.Get("Oncegate-Idempotency"))
		}
		if j1, j2 := resp.Header.Get("Oncegate-Job-Id"), resp2.Header.Get("Oncegate-Job-Id"); j1 == "" || j1 != j2 {
			t.Errorf("job ids %q and %q, want equal", j1, j2)
		}
		if parseCompletion(t, b2).Choices[0].Message.Content != got.Choices[0].Message.Content {
			t.Errorf("replayed content differs: %s", b2)
		}
	})

	t.Run("stream through the api process", func(t *testing.T) {
		body := chatBody("oncegate-mock", "split roles stream", `"stream":true`)
		want := parseCompletion(t, directMock(t, chatBody("oncegate-mock", "split roles stream", "")))
		resp := postChat(t, base, body, map[string]string{"Idempotency-Key": "split-roles-2"})
		b := resp.Body
		if resp.Status != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d Content-Type %q body %s", resp.Status, resp.Header.Get("Content-Type"), b)
		}
		st := chatStreamOf(t, b)
		id, content, done := st.ID, st.Content, st.Done
		if !done || id != want.ID || content != want.Choices[0].Message.Content {
			t.Errorf("stream done=%v id %q content %q, want id %q content %q", done, id, content, want.ID, want.Choices[0].Message.Content)
		}
	})

	t.Run("unknown model is refused by the api process", func(t *testing.T) {
		resp := postChat(t, base, chatBody("gpt-nonexistent", "split roles", ""), nil)
		b := resp.Body
		if resp.Status != http.StatusNotFound {
			t.Errorf("status %d body %s", resp.Status, b)
		}
		assertOpenAIError(t, resp, "model_not_found")
	})

	httpClient.CloseIdleConnections()
	// The api process first (it depends on the worker's NATS), then the worker.
	if code := api.sigterm(t, 15*time.Second); code != 0 {
		t.Errorf("api exit code %d, want 0", code)
	}
	if code := worker.sigterm(t, 15*time.Second); code != 0 {
		t.Errorf("worker exit code %d, want 0", code)
	}
	// Each process ran only its role (the execution above was the worker process's).
	if wl, al := worker.log.String(), api.log.String(); !strings.Contains(wl, "workers started") ||
		strings.Contains(al, "workers started") || strings.Contains(wl, "HTTP API serving") || !strings.Contains(al, "HTTP API serving") {
		t.Errorf("roles not split: want \"workers started\" only in the worker's log and \"HTTP API serving\" only in the api's")
	}
	for _, p := range []*proc{api, worker} {
		if log := p.log.String(); strings.Contains(log, `"level":"error"`) || strings.Contains(log, "panic") {
			t.Errorf("%s logged an error:\n%s", p.name, log)
		}
	}
}
