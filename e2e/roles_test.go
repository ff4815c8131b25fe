package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestSplitRoles runs the real binary as docs/operations/running.md's split layout: an
// API-only process that owns the embedded NATS server (listening on a port) and two
// worker-only processes connected to it, with no store of their own. A request through the
// API is executed by a worker process; a worker's health answer is its metrics listener,
// which `oncegate healthcheck` asks through ONCEGATE_HEALTHCHECK_URL (the image's
// HEALTHCHECK); a worker SIGKILLed takes no request down (the other one serves, the API stays
// ready); and the rest exit cleanly on SIGTERM, the store's owner last.
func TestSplitRoles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the oncegate binary")
	}
	dir := t.TempDir()
	bin := oncegateBinary(t)

	natsAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	api := startProc(t, "api", bin, "serve", "--role", "api", "--nats-listen", natsAddr,
		"--listen", httpAddr, "--data-dir", filepath.Join(dir, "data"))
	waitNATSListening(t, api, natsAddr)
	metrics := []string{testkit.FreeAddr(t), testkit.FreeAddr(t)}
	var workers []*proc
	for i, m := range metrics {
		workers = append(workers, startProc(t, fmt.Sprintf("worker-%d", i+1), bin, "serve", "--role", "worker",
			"--nats-url", "nats://"+natsAddr, "--metrics-listen", m))
	}

	base := "http://" + httpAddr
	apiReady := func() error {
		resp, err := httpClient.Get(base + "/readyz")
		if err != nil {
			return fmt.Errorf("the api process is not ready: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the api process is not ready: /readyz %d", resp.StatusCode)
		}
		return nil
	}
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		for _, p := range append([]*proc{api}, workers...) {
			if p.exited() {
				t.Fatalf("%s exited early: %v", p.name, p.err)
			}
		}
		for _, m := range metrics {
			resp, err := httpClient.Get("http://" + m + "/metrics")
			if err != nil {
				return fmt.Errorf("a worker's metrics listener does not answer: %w", err)
			}
			resp.Body.Close()
		}
		return apiReady()
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

	t.Run("a worker's health check", func(t *testing.T) {
		// The image's HEALTHCHECK asks /readyz on ONCEGATE_LISTEN, which a worker does not serve;
		// ONCEGATE_HEALTHCHECK_URL points it at the worker's metrics listener.
		closed := testkit.FreeAddr(t)
		for _, tc := range []struct {
			name string
			env  []string
			code int
		}{
			{"default /readyz", nil, 1},
			{"ONCEGATE_HEALTHCHECK_URL", []string{"ONCEGATE_HEALTHCHECK_URL=http://" + metrics[0] + "/metrics"}, 0},
		} {
			cmd := exec.Command(bin, "healthcheck")
			cmd.Env = append([]string{"ONCEGATE_LISTEN=" + closed}, tc.env...)
			out, err := cmd.CombinedOutput()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Errorf("%s: oncegate healthcheck exit %d, want %d: %s", tc.name, code, tc.code, out)
			}
		}
	})

	t.Run("a worker killed takes no request down", func(t *testing.T) {
		workers[0].kill(t)
		if err := apiReady(); err != nil {
			t.Fatalf("after a worker's SIGKILL: %v", err)
		}
		body := chatBody("oncegate-mock", "split roles after a worker died", "")
		want := parseCompletion(t, directMock(t, body))
		resp := postChat(t, base, body, map[string]string{"Idempotency-Key": "split-roles-3"})
		if resp.Status != http.StatusOK {
			t.Fatalf("status %d body %s", resp.Status, resp.Body)
		}
		if got := parseCompletion(t, resp.Body); got.Choices[0].Message.Content != want.Choices[0].Message.Content {
			t.Errorf("answer %s, want content %q", resp.Body, want.Choices[0].Message.Content)
		}
	})

	httpClient.CloseIdleConnections()
	// The worker left first, then the api process (it owns the store the worker uses).
	if code := workers[1].sigterm(t, 15*time.Second); code != 0 {
		t.Errorf("worker exit code %d, want 0", code)
	}
	if code := api.sigterm(t, 15*time.Second); code != 0 {
		t.Errorf("api exit code %d, want 0", code)
	}
	// Each process ran only its role (the executions above were the worker processes').
	worker := workers[1]
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
