package workers

import (
	"context"
	"encoding/json"
	"sync/atomic"
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

// TestChargeSweepChargesWhatACrashSkipped: a worker stores COMPLETED, answers, and dies before
// charging; its job message is gone too (JOBS is a memory stream: a NATS restart), so no
// redelivery can repair it. The next pool's sweep charges it once ChargeGrace passed since
// the outcome was written — exactly once, however many sweeps follow.
func TestChargeSweepChargesWhatACrashSkipped(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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

	// The first worker dies between its COMPLETED write and its charge.
	dying := New(srv.JS, store, opts)
	died := make(chan struct{})
	dying.testHookBeforeCharge = func() bool { close(died); return true }
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = dying.Run(runCtx) }()

	const key = "crash-before-charge"
	now := time.Now()
	rec := &kv.Record{State: kv.Pending, Tenant: "t", JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
		Created: now, EpochStarted: now, LeaseUntil: now.Add(2 * time.Second), Progress: kv.ProgressQueued,
		Model: "oncegate-mock", Backends: []string{"mock"},
		Request: json.RawMessage(`{"model":"oncegate-mock","messages":[{"role":"user","content":"c"}]}`)}
	rev, err := store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	job, err := intent.Job(key, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, srv.JS, job); err != nil {
		t.Fatal(err)
	}
	select {
	case <-died:
	case <-ctx.Done():
		t.Fatal("the job never completed")
	}
	stop()
	<-runDone
	if got, _, err := store.Get(ctx, key); err != nil || got.State != kv.Completed {
		t.Fatalf("record after the crash: %+v %v; want COMPLETED", got, err)
	}
	jst, err := srv.JS.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := jst.Purge(ctx); err != nil { // the unacked job message is lost with JOBS
		t.Fatal(err)
	}

	// The next process: its sweeps see the record; its clock is moved past the grace.
	l := ledger.New(srv.JS, prices, "USD")
	var offset atomic.Int64
	opts.ID, opts.Ledger = "w2", l
	opts.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	next := New(srv.JS, store, opts)
	entries := func() []ledger.Entry {
		t.Helper()
		es, err := l.Entries(ctx, "t", time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	sweep := func() {
		t.Helper()
		if _, err := next.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sweep()
	if es := entries(); len(es) != 0 {
		t.Fatalf("charged before the grace passed (the worker could still be charging): %+v", es)
	}
	offset.Store(int64(next.opts.ChargeGrace + time.Second))
	for i := 0; i < 3; i++ {
		sweep()
		es := entries()
		if len(es) != 1 || es[0].Kind != ledger.KindCharge || es[0].JobID != rec.JobID || !es[0].Completed || es[0].OutputTokens != 8 {
			t.Fatalf("after sweep %d: entries %+v; want the one completed charge of job %s", i+1, es, rec.JobID)
		}
	}
}
