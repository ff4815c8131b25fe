package workers_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestLiveOwnerIsNotTakenOver: an owner whose renewals never land (its RenewEvery is past its
// lease; in the fault suite's row 3b they were lost to a partition, or lost the race at its
// heal) still runs its execution. Its job is redelivered after the lease; the other pool, and
// its sweep, ask whether the execution runs (jobs.Running), hear the owner and leave it. The
// backend runs once and the record ends COMPLETED in the owner's epoch. Without the question
// the other pool takes the execution over at the first redelivery and the backend runs twice.
func TestLiveOwnerIsNotTakenOver(t *testing.T) {
	r := resources(t)
	ctx := context.Background()
	mock, gate := newGated(t)
	defer gate.Open()
	var logs testkit.SyncBuffer
	const lease = time.Second
	// Its job message is not kept in progress either (its acks lost like its renewals), so
	// JOBS redelivers it to the other pool, which asks.
	run(t, workers.WithoutHeartbeat(workers.New(r.srv.JS, r.store, workers.Options{ID: "owner", Concurrency: 2, Lease: lease, RenewEvery: time.Hour,
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.New(&logs).With().Str("pool", "owner").Logger(), SweepEvery: -1})))

	const key = "live-owner"
	rec := pendingRecord(lease, "still running")
	rev, err := r.store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	<-gate.entered // the owner runs it, and will not renew

	// The test hears the questions the way the owner does.
	var asked atomic.Int64
	sub, err := r.srv.NC.Subscribe(jobs.RunningSubject(key, 1), func(*nats.Msg) { asked.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "taker", Concurrency: 2, Lease: lease, RenewEvery: 100 * time.Millisecond,
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.New(&logs).With().Str("pool", "taker").Logger(),
		SweepEvery: 100 * time.Millisecond}))

	// Three questions: the lease ran out long ago, and every one was answered "running".
	for deadline := time.Now().Add(30 * time.Second); asked.Load() < 3; time.Sleep(20 * time.Millisecond) {
		cur, _, err := r.store.Get(ctx, key)
		switch {
		case err != nil:
			t.Fatal(err)
		case cur.Epoch != 1:
			t.Fatalf("taken over from a live owner: epoch %d after %d questions\n%s", cur.Epoch, asked.Load(), logs.String())
		case time.Now().After(deadline):
			t.Fatalf("%d questions in 30 s\n%s", asked.Load(), logs.String())
		}
	}
	gate.Open()
	got := r.waitFinal(t, key)
	if got.State != kv.Completed || got.Epoch != 1 || got.Worker != "owner" || got.Result == nil || got.Result.Status != http.StatusOK {
		t.Fatalf("record %s epoch %d worker %q result %+v; want COMPLETED by the owner in epoch 1\n%s",
			got.State, got.Epoch, got.Worker, got.Result, logs.String())
	}
	if n := mock.Mock().Stats().Requests; n != 1 {
		t.Fatalf("%d backend executions, want 1\n%s", n, logs.String())
	}
}
