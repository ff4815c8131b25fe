package workers_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestLateJobClaimsItsEpoch: a job whose submit landed after its lease ran out (a partition
// held the publish) arrives as a first delivery of a lapsed epoch. A taker that read the
// record before (in row 3b, the pool's own sweep, which found nothing running because the
// execution had not started) must lose its compare-and-set once the backend has the call:
// the pool claims the epoch before calling. Without the claim the taker moved the key to
// epoch 2 while epoch 1 ran at the backend, and both completed there.
func TestLateJobClaimsItsEpoch(t *testing.T) {
	r := resources(t)
	ctx := context.Background()
	mock, gate := newGated(t)
	defer gate.Open()
	var logs testkit.SyncBuffer
	const lease = 10 * time.Second
	const key = "late-job"
	rec := pendingRecord(lease, "late")
	rec.LeaseUntil = time.Now().Add(-time.Second) // the lease ran out while the submit was held
	rev, err := r.store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	seen, seenRev, err := r.store.Get(ctx, key) // the taker's read, before the job lands
	if err != nil {
		t.Fatal(err)
	}
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "late", Concurrency: 2, Lease: lease, RenewEvery: time.Hour,
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.New(&logs), SweepEvery: -1}))
	if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	testkit.RequireChanRead(t, gate.entered, 10*time.Second) // the backend has the call

	_, _, _, err = intent.TakeOver(ctx, r.srv.JS, r.store, key, seen, seenRev, time.Now, lease)
	if !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("a taker with the record read before the late job ran: %v, want a conflict (the epoch claimed before the backend call)\n%s", err, logs.String())
	}
	gate.Open()
	got := r.waitFinal(t, key)
	if got.State != kv.Completed || got.Epoch != 1 || got.Worker != "late" || got.Result == nil || got.Result.Status != http.StatusOK {
		t.Fatalf("record %s epoch %d worker %q result %+v; want COMPLETED in epoch 1 by the pool\n%s",
			got.State, got.Epoch, got.Worker, got.Result, logs.String())
	}
	if n := mock.Mock().Stats().Requests; n != 1 {
		t.Fatalf("%d backend executions, want 1\n%s", n, logs.String())
	}
}
