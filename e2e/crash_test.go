package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestWholeProcessCrashLosesNoAcceptedJob: a job answered 202 survives a SIGKILL of the only
// process (API, workers and the embedded NATS together). JOBS and CHUNKS are memory streams,
// so the job message is gone after the restart; the PENDING record (synced file storage) is
// not, and the sweeper re-drives it once its lease ran out. The job completes with the full
// answer under a new epoch, and the same key then replays it.
func TestWholeProcessCrashLosesNoAcceptedJob(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary twice")
	}
	bin := oncegateBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "oncegate.yaml")
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
log_level: warn
workers: {concurrency: 8, sweep_every: 1s}
idempotency: {lease: 2s, renew_every: 500ms}
backends:
  - {name: slow, type: mock, models: [oncegate-mock-crash], mock: {inter_token: 50ms, tokens: 40}}
`, addr, filepath.Join(dir, "data"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway logs:\n%s", logs.String())
		}
	})
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "serve", "--config", cfgPath)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		client := gatewaykit.Client()
		defer client.CloseIdleConnections()
		testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
			resp, err := client.Get("http://" + addr + "/readyz")
			if err != nil {
				return fmt.Errorf("gateway not ready: %w", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("gateway not ready: /readyz %d", resp.StatusCode)
			}
			return nil
		})
		return cmd
	}
	base := "http://" + addr
	body := chatBody("oncegate-mock-crash", "survive the crash", "")
	hdr := map[string]string{"Idempotency-Key": "crash-1"}

	first := start()
	resp, b := do(t, http.MethodPost, base+"/v1/jobs", "application/json", body, hdr)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("submit: %d %s", resp.StatusCode, b)
	}
	var accepted struct{ ID string }
	if err := json.Unmarshal(b, &accepted); err != nil || accepted.ID == "" {
		t.Fatalf("202 body %s: %v", b, err)
	}
	// Kill while the backend call is in flight (40 tokens × 50 ms = 2 s).
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		_, b := do(t, http.MethodGet, base+"/v1/jobs/"+accepted.ID, "", "", nil)
		if strings.Contains(string(b), `"status":"running"`) || strings.Contains(string(b), `"tokens_so_far":`) && !strings.Contains(string(b), `"tokens_so_far":0`) {
			return nil
		}
		return fmt.Errorf("job not running yet: %s", b)
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()

	second := start()
	defer func() {
		_ = second.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- second.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("restarted gateway exit: %v", err)
			}
		case <-time.After(20 * time.Second):
			_ = second.Process.Kill()
			t.Error("restarted gateway did not stop on SIGTERM")
		}
	}()
	var job struct {
		Status string
		Epoch  int
		Result struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		_, b := do(t, http.MethodGet, base+"/v1/jobs/"+accepted.ID, "", "", nil)
		_ = json.Unmarshal(b, &job)
		if job.Status == "completed" || job.Status == "failed" || ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("job not finished after restart: %s", b)
	})
	if job.Status != "completed" || job.Epoch < 2 || job.Result.Usage.CompletionTokens != 40 {
		t.Fatalf("after restart: %+v", job)
	}
	// A retry of the same intent is answered from the record, not executed again.
	resp, b = postChat(t, base, body, hdr)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Oncegate-Idempotency") != "replayed" {
		t.Fatalf("same-key retry: %d %s %s", resp.StatusCode, resp.Header.Get("Oncegate-Idempotency"), b)
	}
}
