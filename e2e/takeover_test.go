package e2e

// Takeover of an execution whose worker stopped acking and renewing (paused, partitioned or
// dead). What each client sees, the contract these tests hold the gateway to:
//
//   - a stream client that already received output of the lost execution gets an explicit
//     terminal SSE error event ("code":"execution_restarted") and no [DONE]: never a splice of
//     the two executions' outputs, never a silent end;
//   - a stream client that had received nothing, and every non-stream client, follows the new
//     epoch transparently and gets one complete answer;
//   - a client that retries with the same key gets the complete answer of the new epoch;
//   - the lost worker (a zombie that wakes up) can write nothing: its next chunk is refused
//     (jobs.ErrFenced, the fence on its chunk subject) and its record write too (kv.ErrConflict,
//     the record's revision moved on).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestTakeoverZombieWorker: the API runs alone (role api, lease 2 s, renewal every 500 ms);
// the test is the first worker, a zombie: it pulls the job from the shared consumer, publishes
// some chunks (or none) and then goes silent: no ack, no renewal, and it never calls the
// backend. A real worker pool then starts; it gets the job again once the ack wait (= lease)
// ran out, takes the record over (epoch 2, the old epoch fenced) and runs the backend once.
func TestTakeoverZombieWorker(t *testing.T) {
	for _, tc := range []struct {
		name         string
		zombieChunks int
	}{
		{"zombie sent output", 3},
		{"zombie sent nothing", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			takeover(t, tc.zombieChunks)
		})
	}
}

func takeover(t *testing.T, zombieChunks int) {
	cfg := gatewaykit.Config(t)
	cfg.Role = "api"
	cfg.NATS.Listen = "127.0.0.1:0" // an api-only process needs a NATS that workers can reach
	cfg.Idempotency.Lease = config.Duration(2 * time.Second)
	cfg.Idempotency.RenewEvery = config.Duration(500 * time.Millisecond)
	gw := gatewaykit.StartGateway(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	key := fmt.Sprintf("xo-takeover-%d", zombieChunks)
	hdr := map[string]string{"Idempotency-Key": key}
	streamBody := chatBody(slowModel, "taken over", `"stream":true`)
	nsBody := chatBody(slowModel, "taken over", "")
	_, wantContent := reference(t, nsBody)

	// The zombie: its own connection, the shared durable consumer, the IDEM bucket.
	zjs := gw.JetStream(t, "xo-zombie")
	zstore, err := kv.Open(ctx, zjs, kv.BucketConfig{TTL: cfg.Idempotency.TTL.D()})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := zjs.Consumer(ctx, jobs.JobsStream, workers.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}

	// Client A streams; it reports each event it reads.
	aEvents := make(chan int, 64)
	type streamed struct {
		status  int
		outcome string
		raw     []byte
		err     error
	}
	aDone := make(chan streamed, 1)
	go func() {
		defer close(aEvents)
		resp, err := openStream(http.MethodPost, gw.URL+chatPath, streamBody, hdr)
		if err != nil {
			aDone <- streamed{err: err}
			return
		}
		defer resp.Body.Close()
		r := newSSEReader(resp.Body)
		n := 0
		for {
			if _, err := r.next(); err != nil {
				if err == io.EOF {
					err = nil
				}
				aDone <- streamed{status: resp.StatusCode, outcome: resp.Header.Get("Oncegate-Idempotency"), raw: r.raw.Bytes(), err: err}
				return
			}
			n++
			select { // never blocks: the reader below only needs the latest count
			case aEvents <- n:
			default:
			}
		}
	}()

	msg := fetchJob(t, cons)
	wire, err := jobs.Decode(msg.Headers(), msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	rec, rev, err := zstore.Get(ctx, wire.Key)
	if err != nil {
		t.Fatal(err)
	}
	if wire.Epoch != 1 || rec.Epoch != 1 || rec.State != kv.Pending || rec.JobID != wire.ID {
		t.Fatalf("zombie: job epoch %d, record %s epoch %d job %s; want a PENDING epoch 1 of job %s", wire.Epoch, rec.State, rec.Epoch, rec.JobID, wire.ID)
	}
	job := intent.JobOf(wire.Key, rec)
	pub := jobs.NewPublisher(zjs, job)
	var zframes []byte
	for i := range zombieChunks {
		f := zombieFrame(i)
		if err := pub.Publish(ctx, jobs.KindData, 0, f); err != nil {
			t.Fatalf("zombie: publish while owning the lease: %v", err)
		}
		zframes = append(zframes, f...)
	}
	// A sees the zombie's output live.
	for seen := 0; seen < zombieChunks; {
		select {
		case n, ok := <-aEvents:
			if !ok {
				t.Fatalf("client A's stream ended after %d of the zombie's %d chunks", seen, zombieChunks)
			}
			seen = n
		case <-ctx.Done():
			t.Fatal("client A never saw the zombie's chunks")
		}
	}

	// Client B, non-stream, joins now: the lease cannot expire for another ~1.5 s, so B is
	// attached to epoch 1 when the takeover happens.
	bDone := async(func() result { return send(http.MethodPost, gw.URL+chatPath, nsBody, hdr) })

	// The zombie goes silent. A real worker pool starts; its backend (the slow mock) counts
	// executions.
	slow := startPool(t, gw, cfg, "xo-rescuer")

	a := <-aDone
	if a.err != nil || a.status != http.StatusOK || a.outcome != "created" {
		t.Fatalf("client A: status %d outcome %q err %v", a.status, a.outcome, a.err)
	}
	st, err := parseChatStream(a.raw)
	if err != nil {
		t.Fatalf("client A: %v: %q", err, a.raw)
	}
	if zombieChunks > 0 {
		// A had output of epoch 1: an explicit restart event, no [DONE], nothing of epoch 2.
		if !bytes.HasPrefix(a.raw, zframes) {
			t.Errorf("client A's stream does not start with the zombie's frames:\n got %q\nwant prefix %q", a.raw, zframes)
		}
		if st.ErrCode != "execution_restarted" || st.Done || len(st.Data) != zombieChunks+1 {
			t.Errorf("client A after output: %d events, error %q, done %v; want the %d zombie frames then one execution_restarted event and no [DONE]: %q",
				len(st.Data), st.ErrCode, st.Done, zombieChunks, a.raw)
		}
		if st.Content != zombieContent(zombieChunks) {
			t.Errorf("client A's stream splices two executions: %q", st.Content)
		}
	} else {
		// A had nothing: it follows epoch 2 transparently.
		if st.ErrCode != "" || !st.Done || st.Content != wantContent {
			t.Errorf("client A with no output: content %q error %q done %v; want the complete answer %q and [DONE]",
				st.Content, st.ErrCode, st.Done, wantContent)
		}
	}

	b := <-bDone
	expect(t, b, http.StatusOK, "joined")
	if _, content, err := answerOf(b.Body); err != nil || content != wantContent {
		t.Errorf("client B (non-stream, joined before the takeover): %q (%v), want the complete answer %q", content, err, wantContent)
	}

	status := idemStatus(t, gw.URL, key, nil)
	if status["state"] != "COMPLETED" || status["epoch"] != 2.0 || status["job_id"] != job.ID {
		t.Errorf("record after the takeover: %v; want COMPLETED, epoch 2, job %s", status, job.ID)
	}

	// Retries with the same key get the complete answer of epoch 2, streamed or not.
	retry := postChat(t, gw.URL, nsBody, hdr)
	expect(t, retry, http.StatusOK, "replayed")
	if _, content, _ := answerOf(retry.Body); content != wantContent {
		t.Errorf("non-stream retry: %q, want %q", content, wantContent)
	}
	sretry := postChat(t, gw.URL, streamBody, hdr)
	expect(t, sretry, http.StatusOK, "replayed")
	if rs, err := parseChatStream(sretry.Body); err != nil || rs.Content != wantContent || !rs.Done {
		t.Errorf("stream retry: %+v (%v), want %q then [DONE]", rs, err, wantContent)
	}

	if n := slow.Stats().Requests; n != 1 {
		t.Errorf("backend executions = %d, want 1 (the zombie never called the backend)", n)
	}

	// The zombie wakes up: every write it tries is refused.
	if err := pub.Publish(ctx, jobs.KindData, 0, zombieFrame(zombieChunks)); !errors.Is(err, jobs.ErrFenced) {
		t.Errorf("zombie's chunk after the takeover: err = %v, want jobs.ErrFenced", err)
	}
	stale := *rec
	stale.State = kv.Completed
	stale.Request = nil
	stale.Result = &kv.Result{Status: http.StatusOK, Body: []byte(`{"zombie":true}`), Finished: time.Now()}
	if _, err := zstore.Update(ctx, job.Key, &stale, rev); !errors.Is(err, kv.ErrConflict) {
		t.Errorf("zombie's record write with its old revision: err = %v, want kv.ErrConflict", err)
	}
	again := postChat(t, gw.URL, nsBody, hdr)
	if !bytes.Equal(again.Body, retry.Body) {
		t.Errorf("the answer changed after the zombie's writes: %s", again.Body)
	}
}

// zombieFrame is a valid chat.completion.chunk frame the zombie worker sends.
func zombieFrame(i int) []byte {
	role := ""
	if i == 0 {
		role = `"role":"assistant",`
	}
	return []byte(fmt.Sprintf(`data: {"id":"chatcmpl-zombie","object":"chat.completion.chunk","created":1700000000,"model":"%s",`+
		`"choices":[{"index":0,"delta":{%s"content":"zombie%d "},"logprobs":null,"finish_reason":null}]}`+"\n\n", slowModel, role, i))
}

func zombieContent(n int) string {
	var s string
	for i := range n {
		s += fmt.Sprintf("zombie%d ", i)
	}
	return s
}

// startPool runs a worker pool beside an api-role gateway, wired like the gateway wires its
// own (gateway startWorkers), with fresh mock backends; it returns the slow mock. The
// pool stops, and its connection closes, before the gateway does.
func startPool(t testing.TB, gw *gatewaykit.Gateway, cfg *config.Config, id string) *mockllm.Server {
	t.Helper()
	nc, err := gw.Connect(id)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	store, err := kv.Open(ctx, js, kv.BucketConfig{TTL: cfg.Idempotency.TTL.D()})
	if err != nil {
		t.Fatal(err)
	}
	backends := map[string]workers.Backend{}
	var slow *mockllm.Server
	for _, b := range cfg.Backends {
		bc, err := backend.New(b, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		backends[b.Name] = bc
		if b.Name == "slowmock" {
			slow = bc.Mock()
		}
	}
	pool := workers.New(js, store, workers.Options{
		ID: id, Concurrency: cfg.Workers.Concurrency,
		Lease: cfg.Idempotency.Lease.D(), RenewEvery: cfg.Idempotency.RenewEvery.D(),
		ShutdownGrace: 5 * time.Second, Backends: backends, Log: zerolog.Nop(),
	})
	done := make(chan error, 1)
	go func() { done <- pool.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker pool: %v", err)
		}
		nc.Close()
	})
	return slow
}

// TestTakeoverWorkerProcessKilled: the same takeover with real processes. Gateway A runs the
// API and the embedded NATS server on a loopback port; worker B is a separate process on it.
// B is SIGKILLed while it streams an answer; worker C starts. The key reaches COMPLETED with
// epoch 2, the stream client that had output gets execution_restarted and no [DONE], a
// non-stream copy and a same-key retry get the full answer. It runs for a small request and
// for one stored in REQUESTS in pieces, which B and then C read back (the mock's answer is
// seeded by the messages' bytes, so the full answer proves C ran the request as sent).
//
// B did send the request to its backend before it died; that attempt is lost with B (its mock
// was in B's memory), so this test counts executions through the record (one completed epoch
// after one lost one), not through a mock counter.
func TestTakeoverWorkerProcessKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the oncegate binary")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool to build the binary")
	}
	bin := oncegateBinary(t)
	for _, tc := range []struct {
		name   string
		prompt string
		pieces uint64 // of its request in REQUESTS while it runs
	}{
		{"small request", "worker killed", 0},
		{"request stored in pieces", "worker killed " + numberedWords(16000), 4}, // ~100 KiB, no two pieces alike
	} {
		t.Run(tc.name, func(t *testing.T) { takeoverProcessKilled(t, bin, tc.prompt, tc.pieces) })
	}
}

func takeoverProcessKilled(t *testing.T, bin, prompt string, pieces uint64) {
	dir := t.TempDir()
	natsAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cfgPath := filepath.Join(dir, "c.yaml")
	yaml := fmt.Sprintf("listen: %s\ndata_dir: %s\nlog_level: warn\n"+
		"idempotency:\n  lease: 2s\n  renew_every: 500ms\n"+
		"backends:\n  - name: slowmock\n    type: mock\n    models: [oncegate-mock-slow]\n    mock:\n      inter_token: 20ms\n      tokens: 16\n",
		httpAddr, filepath.Join(dir, "data"))
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, "api", bin, "serve", "--role", "api", "--nats-listen", natsAddr, "--config", cfgPath)
	base := "http://" + httpAddr
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		// healthz, not readyz: A runs no worker, so it is ready only once worker B runs
		if r := send(http.MethodGet, base+"/healthz", "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("gateway A is not serving: %d %v", r.Status, r.Err)
		}
		return nil
	})
	workerB := startProc(t, "worker-b", bin, "serve", "--role", "worker", "--nats-url", "nats://"+natsAddr, "--config", cfgPath)

	const key = "xo-process-kill"
	hdr := map[string]string{"Idempotency-Key": key}
	knobs := `"mock":{"tokens":40,"inter_token_ms":50}` // ≈2 s of output
	streamBody := chatBody(slowModel, prompt, `"stream":true,`+knobs)
	nsBody := chatBody(slowModel, prompt, knobs)
	_, wantContent := reference(t, nsBody)

	resp, err := openStream(http.MethodPost, base+chatPath, streamBody, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	r := newSSEReader(resp.Body)
	for i := 0; i < 3; i++ { // the role chunk and two tokens at least
		if _, err := r.next(); err != nil {
			t.Fatalf("stream ended before worker B was killed: %v: %q", err, r.raw.Bytes())
		}
	}
	nsDone := async(func() result { return send(http.MethodPost, base+chatPath, nsBody, hdr) })
	if got := storedPieces(t, natsAddr); got != pieces {
		t.Fatalf("REQUESTS holds %d messages while B runs, want %d", got, pieces)
	}

	workerB.kill(t)
	startProc(t, "worker-c", bin, "serve", "--role", "worker", "--nats-url", "nats://"+natsAddr, "--config", cfgPath)

	st, err := parseChatStream(r.drain())
	if err != nil {
		t.Fatalf("stream: %v: %q", err, r.raw.Bytes())
	}
	if st.ErrCode != "execution_restarted" || st.Done || !strings.HasPrefix(wantContent, st.Content) {
		t.Errorf("stream client after the kill: error %q, done %v, content %q; want a prefix of %q, then execution_restarted and no [DONE]",
			st.ErrCode, st.Done, st.Content, wantContent)
	}

	var status map[string]any
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if status = idemStatus(t, base, key, nil); status["state"] == "PENDING" {
			return fmt.Errorf("the key is not finished by worker C: %v", status)
		}
		return nil
	})
	if status["state"] != "COMPLETED" || status["epoch"] != 2.0 {
		t.Errorf("record: %v, want COMPLETED at epoch 2", status)
	}
	ns := <-nsDone
	expect(t, ns, http.StatusOK, "joined")
	if _, content, _ := answerOf(ns.Body); content != wantContent {
		t.Errorf("non-stream copy: %q, want %q", content, wantContent)
	}
	retry := postChat(t, base, nsBody, hdr)
	expect(t, retry, http.StatusOK, "replayed")
	if _, content, _ := answerOf(retry.Body); content != wantContent {
		t.Errorf("same-key retry: %q, want the full answer %q", content, wantContent)
	}
	sretry := postChat(t, base, streamBody, hdr)
	expect(t, sretry, http.StatusOK, "replayed")
	if rs, err := parseChatStream(sretry.Body); err != nil || rs.Content != wantContent || !rs.Done {
		t.Errorf("same-key stream retry: %+v (%v), want %q then [DONE]", rs, err, wantContent)
	}
}

// storedPieces is how many messages REQUESTS holds on the NATS server at addr.
func storedPieces(t *testing.T, addr string) uint64 {
	t.Helper()
	js := dialJetStream(t, "nats://"+addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, kv.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// numberedWords is "w0 w1 … w(n-1)": a prompt in which no stretch repeats.
func numberedWords(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d ", i)
	}
	return b.String()
}
