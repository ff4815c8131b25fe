package e2e

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestRefusedStaysRefused is issue 43's exactly-once hole, on the split roles running.md used to
// show (a worker owning the embedded NATS; it now recommends the api): that process is SIGKILLed, a keyless request to the
// api process is refused with 503 store_unavailable, and the owner restarts. Before, the claim
// that request wrote while its NATS was gone sat in the NATS client's reconnect buffer, was sent
// when the server came back, and the lease sweep executed and billed it (its status read
// COMPLETED) although its client had been refused. A 503 is binding: nothing it wrote runs later.
func TestRefusedStaysRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the oncegate binary")
	}
	dir := t.TempDir()
	bin := oncegateBinary(t)
	// A short lease and sweep, so the re-drive the old code made comes within seconds.
	cfgPath := filepath.Join(dir, "oncegate.yaml")
	cfg := "idempotency:\n  lease: 3s\n  renew_every: 1s\nworkers:\n  sweep_every: 1s\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	startWorker := func() *proc {
		p := startProc(t, "worker", bin, "serve", "--role", "worker", "--config", cfgPath,
			"--data-dir", filepath.Join(dir, "worker-data"), "--nats-listen", natsAddr)
		waitNATSListening(t, p, natsAddr)
		return p
	}
	worker := startWorker()
	api := startProc(t, "api", bin, "serve", "--role", "api", "--config", cfgPath, "--nats-url", "nats://"+natsAddr,
		"--listen", httpAddr, "--data-dir", filepath.Join(dir, "api-data"))
	base := "http://" + httpAddr
	waitReady := func() {
		testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
			if api.exited() {
				t.Fatalf("api exited early: %v", api.err)
			}
			return testkit.Ready(httpClient, base)
		})
	}
	waitReady()

	worker.kill(t)
	body := chatBody("oncegate-mock", "refused while the store is gone", "")
	key, err := autoKey("anonymous", chatPath, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	refused := postChat(t, base, body, nil)
	expectError(t, refused, http.StatusServiceUnavailable, "store_unavailable")
	if msg := string(refused.Body); strings.Contains(msg, "Idempotency-Key") {
		t.Errorf("the refusal of a request sent without a key speaks of its key: %s", msg)
	}
	if refused.Header.Get("x-should-retry") != "true" || refused.Header.Get("Retry-After") == "" {
		t.Errorf("refusal headers: x-should-retry %q Retry-After %q, want true and a delay",
			refused.Header.Get("x-should-retry"), refused.Header.Get("Retry-After"))
	}
	refusedAt := time.Now()

	worker = startWorker()
	waitReady()
	// Past the refused claim's lease and several sweeps, its key must hold nothing that ran or
	// runs. With nats.go's reconnect buffer off, the claim never reaches the store (no record);
	// one that reached it late all the same (kv.Record.AdmitBy) may show as queued until the
	// sweep releases it (FAILED), never dispatched. The old code's re-drive came about a second
	// after the worker's start. This watches a bounded window: what it checks is an absence.
	statusURL := base + "/v1/idempotency/" + url.PathEscape(key)
	var last result
	for end := refusedAt.Add(3*time.Second + 5*time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		last = do(t, http.MethodGet, statusURL, "", nil)
		switch s := string(last.Body); {
		case last.Status == http.StatusNotFound:
		case last.Status != http.StatusOK:
			t.Fatalf("status of the refused key: %d %s", last.Status, s)
		case strings.Contains(s, `"state":"COMPLETED"`) || !strings.Contains(s, `"attempts":0`) ||
			strings.Contains(s, `"state":"PENDING"`) && !strings.Contains(s, `"progress":"queued"`):
			t.Fatalf("the refused request's key holds an execution: %s", s)
		}
	}
	if last.Status == http.StatusOK && !strings.Contains(string(last.Body), `"state":"FAILED"`) {
		t.Fatalf("the refused request's claim was not released after its lease and the sweeps: %s", last.Body)
	}
	// The gateway works again: the same request now runs once, as a new intent.
	again := postChat(t, base, body, nil)
	expect(t, again, http.StatusOK, "created")
	if k := again.Header.Get("Idempotency-Key"); k != key {
		t.Errorf("echoed key %q, want %q (the key the status was read under)", k, key)
	}
	if code := api.sigterm(t, 15*time.Second); code != 0 {
		t.Errorf("api exit code %d, want 0", code)
	}
	if code := worker.sigterm(t, 15*time.Second); code != 0 {
		t.Errorf("worker exit code %d, want 0", code)
	}
}
