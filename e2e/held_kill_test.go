package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestHeldJobOfAKilledNodeAnswersItsRetry (issue 44): two gateway processes (every role) on a
// three-server cluster of their own. A job admitted on node A runs there as a held job; node A
// is SIGKILLed while its backend call is under way. The client's retry, sent to node B, joins
// the execution, and node B asks at once for A's pool (workers.Pool.CheckHolder), finds it
// gone and takes the execution over: the retry is answered with the complete answer, in
// epoch 2. The record's lease (5 minutes) and the sweep's period (10 minutes) are both longer
// than the client's timeout (60 s), so nothing else could have re-driven it in time: without
// the check, the retry times out.
func TestHeldJobOfAKilledNodeAnswersItsRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nats-server processes and the oncegate binary")
	}
	t.Parallel() // processes and ports of its own; mostly waiting
	procs := runNATSProcs(t, "1s")
	const cfg = "idempotency:\n  lease: 5m\nworkers:\n  sweep_every: 10m\nnats:\n  replicas: 3\n"
	baseB, b := procs.startGateway(cfg)
	baseA, a := procs.startGateway(cfg)
	// A pool's first sweep comes a second after it starts, the next 10 minutes later: B's must
	// be over before A holds the job, or it could be the one to find A gone.
	time.Sleep(3 * time.Second)

	const key = "held-killed-node"
	body := chatBody("oncegate-mock", "held by a node that dies", `"mock":{"ttft_ms":4000}`)
	_, wantContent := reference(t, body)
	r := do(t, http.MethodPost, baseA+chatPath, body, map[string]string{"Idempotency-Key": key, "Prefer": "respond-async"})
	expect(t, r, http.StatusAccepted, "created")
	id := r.Header.Get("Oncegate-Job-Id")
	// Running on A: its attempt is sent (the progress the status API shows, from node B).
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		if j, jr := getJob(t, baseB, id); j.Status != "running" || j.Attempts != 1 {
			return fmt.Errorf("the job is not running its first attempt: %d %s", jr.Status, jr.Body)
		}
		return nil
	})
	if st := idemStatus(t, baseB, key, nil); st["epoch"] != 1.0 {
		t.Fatalf("key status before the kill: %v", st)
	}
	a.kill(t)

	retry := postChat(t, baseB, body, map[string]string{"Idempotency-Key": key})
	if retry.Status != http.StatusOK {
		t.Fatalf("the retry on node B: %d %s\nnode B's log:\n%s", retry.Status, retry.Body, logTail(b))
	}
	if _, content, err := answerOf(retry.Body); err != nil || content != wantContent {
		t.Fatalf("the retry's answer %q (%v), want the complete answer %q", content, err, wantContent)
	}
	st := idemStatus(t, baseB, key, nil)
	if st["state"] != "COMPLETED" || st["epoch"] != 2.0 || st["takeovers"] != 1.0 {
		t.Errorf("key status after the retry: %v, want COMPLETED in epoch 2 after one takeover", st)
	}
	if log := b.log.String(); !strings.Contains(log, "re-driven: its worker is gone") || !strings.Contains(log, "a copy's check") {
		t.Errorf("node B's log does not say it took the execution over on the retry's check:\n%s", logTail(b))
	}
}

// logTail is the end of p's output (its last 4,000 bytes).
func logTail(p *proc) string {
	s := p.log.String()
	return s[max(0, len(s)-4000):]
}
