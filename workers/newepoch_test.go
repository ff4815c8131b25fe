package workers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestNewEpochWaitsForTheKeysLastExecution: the job of a new epoch of a key arrives while this
// pool still runs the key's last epoch (an auto key reclaimed as soon as its answer was read,
// while the old execution still charged and acked: CI saw TestJobsKeylessAfterWindow's second
// job queued for seconds). It waits for that execution to end and runs, instead of being
// handed back and then waiting, as a redelivery, for the whole lease of an epoch nobody runs.
func TestNewEpochWaitsForTheKeysLastExecution(t *testing.T) {
	r := resources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const lease = time.Minute
	_, gate := newGated(t)
	defer gate.Open()
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "pool", Concurrency: 4, Lease: lease, RenewEvery: 20 * time.Second,
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.Nop(), SweepEvery: -1}))

	const key = "new-epoch"
	rec := pendingRecord(lease, "epoch 1")
	rev, err := r.store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	<-gate.entered // epoch 1 runs in this pool

	// The key moves to a new epoch with a job of its own, which arrives while epoch 1 runs.
	now := time.Now()
	next := *rec
	next.JobID, next.Epoch, next.EpochStarted, next.LeaseUntil = jobs.NewID(), 2, now, now.Add(lease)
	rev2, err := r.store.Update(ctx, key, &next, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, &next, rev2)); err != nil {
		t.Fatal(err)
	}
	cons, err := r.srv.JS.Consumer(ctx, jobs.JobsStream, workers.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		info, err := cons.Info(ctx)
		if err != nil || info.Delivered.Consumer < 2 {
			return fmt.Errorf("the second job not delivered yet: %+v %v", info, err)
		}
		return nil
	})
	gate.Open() // epoch 1's call returns; its outcome's write is refused (the key moved on)

	testkit.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		cur, _, err := r.store.Get(ctx, key)
		if err != nil || cur.State != kv.Completed || cur.Epoch != 2 {
			return fmt.Errorf("record %s epoch %d (%v); want epoch 2 COMPLETED well before its %s lease", cur.State, cur.Epoch, err, lease)
		}
		return nil
	})
}
