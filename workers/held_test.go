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

// hold waits until pool runs and reserves one of its slots.
func hold(t *testing.T, pool *workers.Pool) *workers.Held {
	t.Helper()
	var h *workers.Held
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if h = pool.Hold(); h == nil {
			return fmt.Errorf("no slot held: the pool is not running yet")
		}
		return nil
	})
	return h
}

// submitHeld claims key for rec, naming h's pool, and runs its job as held there.
func submitHeld(t *testing.T, r *rig, h *workers.Held, key string, rec *kv.Record) uint64 {
	t.Helper()
	ctx := context.Background()
	rec.Worker = h.Worker()
	rev, err := r.store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := jobs.HeldMsg(mustJob(t, key, rec, rev))
	if err != nil {
		t.Fatal(err)
	}
	h.Run(m, time.Now(), nil)
	return rev
}

// TestHeldJobRunsWhereItIsHeld: a held job runs on the pool that holds it, never on another
// pool sharing the workers' consumer, and JOBS never holds it (jobs.Queued says no: nothing
// would be redelivered): its claim is its stored message (kv/TestClaimCarriesItsMsgID).
func TestHeldJobRunsWhereItIsHeld(t *testing.T) {
	r := resources(t)
	ctx := context.Background()
	mock, _ := newGated(t)
	holder := workers.New(r.srv.JS, r.store, workers.Options{ID: "holder", Concurrency: 2, Lease: time.Minute, RenewEvery: 20 * time.Second,
		Backends: map[string]workers.Backend{"mock": mock}, Log: zerolog.Nop(), SweepEvery: -1})
	run(t, holder)
	other, _ := newGated(t)
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "other", Concurrency: 2, Lease: time.Minute, RenewEvery: 20 * time.Second,
		Backends: map[string]workers.Backend{"mock": other}, Log: zerolog.Nop(), SweepEvery: -1}))

	const key = "held-here"
	rec := pendingRecord(time.Minute, "held")
	submitHeld(t, r, hold(t, holder), key, rec)
	if queued, err := jobs.Queued(ctx, r.srv.JS, key); err != nil || queued {
		t.Fatalf("queued %v %v: a held job is not in the queue", queued, err)
	}
	got := finished(t, r, key)
	if got.State != kv.Completed || got.Epoch != 1 || got.Worker != "holder" || got.Attempts != 1 {
		t.Fatalf("record %s epoch %d worker %q attempts %d; want COMPLETED by the holder in one attempt", got.State, got.Epoch, got.Worker, got.Attempts)
	}
	st, err := r.srv.JS.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.LastSeq != 0 {
		t.Fatalf("JOBS info %+v, %v: a held job is stored nowhere but its claim", info, err)
	}
}

// TestHeldJobOfADeadPoolIsTakenOver: the pool running a held job dies (its connection closes,
// as a killed process's does) after sending its attempt. No JetStream redelivery can bring
// the job back; another pool takes the execution over at once, counting the sent attempt,
// instead of after the one-minute lease:
//   - its sweep finds the record's worker gone;
//   - with its sweeps off, asked by a copy of the request that joined the execution on its
//     node (CheckHolder, as the admission of a copy does): a client's retry is not left
//     waiting for the next sweep.
func TestHeldJobOfADeadPoolIsTakenOver(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sweep time.Duration
		ask   bool
	}{
		{name: "by the sweep", sweep: 200 * time.Millisecond},
		{name: "asked by a copy", sweep: -1, ask: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := resources(t)
			ctx := context.Background()
			const lease = time.Minute
			var logs testkit.SyncBuffer
			ownerNC, doomed, gate := startDoomed(t, r, lease, &logs)
			defer gate.Open()

			const key = "held-dead-owner"
			rec := pendingRecord(lease, "the holder dies")
			rev := submitHeld(t, r, hold(t, doomed), key, rec)
			sentByDoomed(t, r, gate, rec)
			ownerNC.Close() // the process is gone: its presence and its writes with it
			cur, crev, err := r.store.Get(ctx, key)
			if err != nil || crev != rev || cur.Worker != "doomed" {
				t.Fatalf("record %+v at %d (%v): want the claim, naming the dead pool", cur, crev, err)
			}

			mock, _ := newGated(t)
			taker := workers.New(r.srv.JS, r.store, workers.Options{ID: "taker", Concurrency: 2, Lease: lease, RenewEvery: 20 * time.Second,
				Backends: map[string]workers.Backend{"mock": mock}, Log: zerolog.New(&logs).With().Str("pool", "taker").Logger(), SweepEvery: tc.sweep})
			run(t, taker)
			if tc.ask { // asked again until its pool runs (one that does not asks nothing); one check at a time
				testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
					taker.CheckHolder(key, cur)
					if now, _, err := r.store.Get(ctx, key); err != nil || now.Epoch == 1 {
						return fmt.Errorf("record %+v %v: still the dead holder's epoch", now, err)
					}
					return nil
				})
			}
			takenOverEarly(t, r, key, rec, &logs)
		})
	}
}

// TestHeldJobOfALivePoolIsLeftToIt: the sweep of another pool leaves a held execution whose
// pool answers for itself, however long it runs within its lease, and so does a check asked
// by a copy (CheckHolder).
func TestHeldJobOfALivePoolIsLeftToIt(t *testing.T) {
	r := resources(t)
	ctx := context.Background()
	_, gate := newGated(t)
	holder := workers.New(r.srv.JS, r.store, workers.Options{ID: "slow-holder", Concurrency: 2, Lease: time.Minute, RenewEvery: 20 * time.Second,
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.Nop(), SweepEvery: -1})
	run(t, holder)
	sweeper := workers.New(r.srv.JS, r.store, workers.Options{ID: "sweeper", Concurrency: 2, Lease: time.Minute, RenewEvery: 20 * time.Second,
		Log: zerolog.Nop(), SweepEvery: -1})
	run(t, sweeper)
	const key = "held-live-owner"
	rec := pendingRecord(time.Minute, "slow")
	submitHeld(t, r, hold(t, holder), key, rec)
	<-gate.entered
	for range 3 {
		if n, err := sweeper.Sweep(ctx); err != nil || n != 0 {
			t.Fatalf("sweep re-drove %d (%v): the holder answers for itself", n, err)
		}
	}
	cur, _, err := r.store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		sweeper.CheckHolder(key, cur)
	}
	// A check that found the holder gone would decide after the presence span and take over.
	time.Sleep(jobs.PresenceSpan + time.Second)
	gate.Open()
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		cur, _, err := r.store.Get(ctx, key)
		if err != nil || cur.State != kv.Completed || cur.Epoch != 1 || cur.Worker != "slow-holder" {
			return fmt.Errorf("record %+v %v, want COMPLETED in epoch 1 by its holder", cur, err)
		}
		return nil
	})
}
