package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

// crashRig is a JetStream with JOBS, CHUNKS, LEDGER and the records, the mock backend, and
// the Options of a worker pool on them, for tests whose worker dies at a chosen step.
type crashRig struct {
	srv    *testkit.JetStream
	store  *kv.Store
	opts   Options
	prices ledger.Prices
}

func newCrashRig(t *testing.T, ctx context.Context) *crashRig {
	t.Helper()
	srv := testkit.RunJetStream(t, time.Second)
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := ledger.EnsureStream(ctx, srv.JS); err != nil {
		t.Fatal(err)
	}
	store, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mock, err := backend.New(config.Backend{Name: "mock", Type: config.TypeMock, Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 8}, Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	prices := ledger.Prices{"oncegate-mock": {InputPerMillion: 1_000_000, OutputPerMillion: 1_000_000}}
	opts := Options{ID: "w1", Concurrency: 2, Lease: 2 * time.Second, RenewEvery: 200 * time.Millisecond,
		Backends: map[string]Backend{"mock": mock}, Log: zerolog.Nop(), SweepEvery: -1, Ledger: ledger.New(srv.JS, prices, "USD")}
	return &crashRig{srv: srv, store: store, opts: opts, prices: prices}
}

// submit claims key for a non-stream intent and submits its job, as an API node does.
func (r *crashRig) submit(t *testing.T, ctx context.Context, key string) *kv.Record {
	t.Helper()
	return r.submitIntent(t, ctx, key, false)
}

// submitStream is submit for a stream intent.
func (r *crashRig) submitStream(t *testing.T, ctx context.Context, key string) *kv.Record {
	t.Helper()
	return r.submitIntent(t, ctx, key, true)
}

func (r *crashRig) submitIntent(t *testing.T, ctx context.Context, key string, stream bool) *kv.Record {
	t.Helper()
	now := time.Now()
	body := `{"model":"oncegate-mock","messages":[{"role":"user","content":"c"}]}`
	if stream {
		body = `{"model":"oncegate-mock","stream":true,"messages":[{"role":"user","content":"c"}]}`
	}
	rec := &kv.Record{State: kv.Pending, Tenant: "t", JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
		Created: now, EpochStarted: now, LeaseUntil: now.Add(2 * time.Second), Progress: kv.ProgressQueued,
		Model: "oncegate-mock", Backends: []string{"mock"}, Stream: stream, Request: json.RawMessage(body)}
	rev, err := r.store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	job, err := intent.Job(key, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, job); err != nil {
		t.Fatal(err)
	}
	return rec
}

// run runs pool until the returned stop, which waits for it to end.
func (r *crashRig) run(ctx context.Context, pool *Pool) (stop func()) {
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = pool.Run(runCtx) }()
	return func() { cancel(); <-done }
}

// TestRedeliveryAnnouncesAFinishedExecution: a worker stores COMPLETED and dies before its
// terminal chunk. A copy following the execution must not wait for it until its deadline:
// the job's redelivery finds the outcome stored and writes the terminal chunk, once, and the
// follower ends with the stored answer. Before, only the charge was repaired.
func TestRedeliveryAnnouncesAFinishedExecution(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newCrashRig(t, ctx)
	hub := jobs.NewHub(r.srv.NC, r.srv.JS, zerolog.Nop(), jobs.HubOptions{})
	defer hub.Close()

	dying := New(r.srv.JS, r.store, r.opts)
	died := make(chan struct{})
	dying.testHookBeforeAnnounce = func() bool { close(died); return true }
	stop := r.run(ctx, dying)
	const key = "crash-before-announce"
	rec := r.submit(t, ctx, key)
	fl, err := hub.Join(ctx, jobs.ChunkSubject(key, rec.JobID, rec.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	testkit.RequireChanRead(t, died, 20*time.Second)
	stop()
	stored, _, err := r.store.Get(ctx, key)
	if err != nil || stored.State != kv.Completed {
		t.Fatalf("record after the crash: %+v %v; want COMPLETED", stored, err)
	}
	if fl.Ready() {
		t.Fatal("the follower has a chunk although the worker died before writing any")
	}

	opts := r.opts
	opts.ID = "w2"
	defer r.run(ctx, New(r.srv.JS, r.store, opts))()

	ch, err := fl.Next(ctx) // the redelivery comes after the job's AckWait (the 2 s lease)
	if err != nil {
		t.Fatalf("follower: %v, want the terminal chunk", err)
	}
	if ch.Kind != jobs.KindResult || ch.Status != http.StatusOK || !bytes.Equal(ch.Payload, stored.Result.Body) {
		t.Fatalf("terminal chunk %s %d %q, want the stored result %q", ch.Kind, ch.Status, ch.Payload, stored.Result.Body)
	}
	// A second announcement finds the terminal chunk there and writes nothing.
	if wrote, err := jobs.Announce(ctx, r.srv.JS, key, rec.JobID, rec.Epoch, jobs.Chunk{Kind: jobs.KindResult}); err != nil || wrote {
		t.Fatalf("announce again: wrote %v, %v; want nothing written", wrote, err)
	}
}
