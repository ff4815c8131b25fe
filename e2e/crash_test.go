package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
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
	addr := testkit.FreeAddr(t)
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
	start := func(name string) *proc {
		p := startProc(t, name, bin, "serve", "--config", cfgPath)
		testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
			if r := send(http.MethodGet, "http://"+addr+"/readyz", "", nil); r.Status != http.StatusOK {
				return fmt.Errorf("gateway not ready: /readyz %d %v", r.Status, r.Err)
			}
			return nil
		})
		return p
	}
	base := "http://" + addr
	body := chatBody("oncegate-mock-crash", "survive the crash", "")
	hdr := map[string]string{"Idempotency-Key": "crash-1"}

	first := start("first")
	resp := do(t, http.MethodPost, base+"/v1/jobs", body, hdr)
	b := resp.Body
	if resp.Status != http.StatusAccepted {
		t.Fatalf("submit: %d %s", resp.Status, b)
	}
	var accepted struct{ ID string }
	if err := json.Unmarshal(b, &accepted); err != nil || accepted.ID == "" {
		t.Fatalf("202 body %s: %v", b, err)
	}
	// Kill while the backend call is in flight (40 tokens × 50 ms = 2 s).
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		b := do(t, http.MethodGet, base+"/v1/jobs/"+accepted.ID, "", nil).Body
		if strings.Contains(string(b), `"status":"running"`) || strings.Contains(string(b), `"tokens_so_far":`) && !strings.Contains(string(b), `"tokens_so_far":0`) {
			return nil
		}
		return fmt.Errorf("job not running yet: %s", b)
	})
	first.kill(t)

	second := start("restarted")
	defer func() {
		if code := second.sigterm(t, 20*time.Second); code != 0 {
			t.Errorf("restarted gateway exit code %d, want 0", code)
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
		b := do(t, http.MethodGet, base+"/v1/jobs/"+accepted.ID, "", nil).Body
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
	resp = postChat(t, base, body, hdr)
	b = resp.Body
	if resp.Status != http.StatusOK || resp.Header.Get("Oncegate-Idempotency") != "replayed" {
		t.Fatalf("same-key retry: %d %s %s", resp.Status, resp.Header.Get("Oncegate-Idempotency"), b)
	}
}
