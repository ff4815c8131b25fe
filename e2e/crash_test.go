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
	t.Parallel() // processes and ports of its own; mostly waiting (CI's e2e time, issue 34)
	if testing.Short() {
		t.Skip("builds and runs the binary twice")
	}
	bin := oncegateBinary(t)
	addr := testkit.FreeAddr(t)
	cfgPath := crashConfig(t, addr, `backends:
  - {name: slow, type: mock, models: [oncegate-mock-crash], mock: {inter_token: 50ms, tokens: 40}}
`)
	start := func(name string) *proc { return startServe(t, name, bin, cfgPath, "http://"+addr) }
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

// TestCrashMidBypassIsNotRedriven: a bypassed request runs on the node that admitted it, with
// no record and no job message, so a SIGKILL of that node mid-call leaves nothing to re-drive:
// after a restart and several lease lengths of sweeps the backend has still been called once
// (on the job path the sweep found the PENDING record without its job and ran the bypass again
// for a client long gone), and the next bypass executes as usual. The backend is a process of
// its own, so its count spans the gateway's restart.
func TestCrashMidBypassIsNotRedriven(t *testing.T) {
	t.Parallel() // processes and ports of its own; mostly waiting (CI's e2e time, issue 34)
	if testing.Short() {
		t.Skip("builds and runs the binary twice")
	}
	bin := oncegateBinary(t)
	addr := testkit.FreeAddr(t)
	mockAddr, mockStats := startMockProc(t, bin, "--tokens", "40", "--inter-token", "100ms")
	cfgPath := crashConfig(t, addr, fmt.Sprintf(`backends:
  - {name: up, type: openai, base_url: "http://%s/v1", models: [oncegate-mock-up], timeout: 60s}
routes:
  - {model: oncegate-mock, backends: [up]}
`, mockAddr))
	base := "http://" + addr
	start := func(name string) *proc { return startServe(t, name, bin, cfgPath, base) }
	body := chatBody("oncegate-mock", "bypass, then the node dies", "")
	bypass := map[string]string{"X-Allow-Duplicate": "true"}

	first := start("first")
	gone := make(chan result, 1)
	go func() { gone <- send(http.MethodPost, base+chatPath, body, bypass) }()
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if n := mockStats(); n != 1 {
			return fmt.Errorf("the backend has %d requests, want the bypass's 1", n)
		}
		return nil
	})
	first.kill(t) // 40 tokens × 100 ms: the call is 4 s long, so it is still running
	if r := <-gone; r.Err == nil {
		t.Fatalf("the bypass was answered (%d) although its node was killed mid-call", r.Status)
	}

	second := start("restarted")
	defer func() {
		if code := second.sigterm(t, 20*time.Second); code != 0 {
			t.Errorf("restarted gateway exit code %d, want 0", code)
		}
	}()
	// Nothing to observe but an absence: three lease lengths, six sweeps.
	time.Sleep(6 * time.Second)
	if n := mockStats(); n != 1 {
		t.Fatalf("the backend has %d requests after the restart, want 1: the killed bypass was run again", n)
	}
	r := postChat(t, base, chatBody("oncegate-mock", "a bypass after the restart", `"mock":{"inter_token_ms":0}`), bypass)
	if r.Status != http.StatusOK || r.Header.Get("Oncegate-Idempotency") != "bypassed" {
		t.Fatalf("bypass after the restart: %d %s %s", r.Status, r.Header.Get("Oncegate-Idempotency"), r.Body)
	}
	if n := mockStats(); n != 2 {
		t.Fatalf("the backend has %d requests, want 2", n)
	}
}

// startMockProc starts `oncegate mock` with args as a process of its own (its count spans a
// gateway's restart) and waits until it serves; requests reads its count of backend calls.
func startMockProc(t *testing.T, bin string, args ...string) (addr string, requests func() int) {
	t.Helper()
	addr = testkit.FreeAddr(t)
	startProc(t, "mock", bin, append([]string{"mock", "--listen", addr}, args...)...)
	stats := func() (int, error) {
		var st struct{ Requests int }
		r := send(http.MethodGet, "http://"+addr+"/stats", "", nil)
		if err := json.Unmarshal(r.Body, &st); r.Status != http.StatusOK || err != nil {
			return 0, fmt.Errorf("mock stats: %d %v %s", r.Status, r.Err, r.Body)
		}
		return st.Requests, nil
	}
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		_, err := stats()
		return err
	})
	return addr, func() int {
		t.Helper()
		n, err := stats()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// startServe starts `oncegate serve --config cfgPath` as a process named name and waits until
// base answers /readyz.
func startServe(t *testing.T, name, bin, cfgPath, base string) *proc {
	t.Helper()
	p := startProc(t, name, bin, "serve", "--config", cfgPath)
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		if r := send(http.MethodGet, base+"/readyz", "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("gateway not ready: /readyz %d %v", r.Status, r.Err)
		}
		return nil
	})
	return p
}

// crashConfig writes the config of a crash test's gateway, listening on addr with its data in
// a temporary directory, a 2 s lease and a sweep every second, and backends (the YAML of its
// backends and routes); it returns the file's path.
func crashConfig(t *testing.T, addr, backends string) string {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "oncegate.yaml")
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
log_level: warn
workers: {concurrency: 8, sweep_every: 1s}
idempotency: {lease: 2s, renew_every: 500ms}
`, addr, filepath.Join(dir, "data")) + backends
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgPath
}
