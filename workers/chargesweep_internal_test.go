package workers

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/intent"
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newCrashRig(t, ctx)
	srv, store, opts, prices := r.srv, r.store, r.opts, r.prices

	// The first worker dies between its COMPLETED write and its charge.
	dying := New(srv.JS, store, opts)
	died := make(chan struct{})
	dying.testHookBeforeCharge = func() bool { close(died); return true }
	stop := r.run(ctx, dying)

	const key = "crash-before-charge"
	rec := r.submit(t, ctx, key)
	select {
	case <-died:
	case <-ctx.Done():
		t.Fatal("the job never completed")
	}
	stop()
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
	entries := func() []ledger.Entry { return tenantEntries(t, ctx, l) }
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
	// A pool that sees w1 still posting leaves the record to it (issue 44: on a cluster every
	// other pool read every record); this one does not, and w1 is gone.
	trusting := New(srv.JS, store, Options{ID: "w3", Concurrency: 1, Lease: opts.Lease, RenewEvery: opts.RenewEvery,
		Backends: opts.Backends, Ledger: l, Now: opts.Now, Running: func(w string) bool { return w == "w1" }})
	if _, err := trusting.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if es := entries(); len(es) != 0 {
		t.Fatalf("charged by a pool that sees the record's own pool running: %+v", es)
	}
	for i := 0; i < 3; i++ {
		sweep()
		es := entries()
		if len(es) != 1 || es[0].Kind != ledger.KindCharge || es[0].JobID != rec.JobID || !es[0].Completed || es[0].OutputTokens != 8 {
			t.Fatalf("after sweep %d: entries %+v; want the one completed charge of job %s", i+1, es, rec.JobID)
		}
	}
}

// TestArchivedCopyIsChargedOnce: an auto key's finished execution is copied under a key of its
// own (intent's archive) before the auto key moves on to a newer identical request. The copy
// is a billable record written after the charge, so a sweep reads it: it must find the charge
// the worker wrote under the original key, not bill the execution again under the copy's
// (issue 34: every archived execution was charged twice, and reconcile did not see it).
func TestArchivedCopyIsChargedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newCrashRig(t, ctx)
	l := r.opts.Ledger.(*ledger.Ledger)
	entries := func() []ledger.Entry { return tenantEntries(t, ctx, l) }
	stop := r.run(ctx, New(r.srv.JS, r.store, r.opts))
	const key = "auto-key-of-a-finished-execution"
	first := r.submit(t, ctx, key)
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if n := len(entries()); n != 1 {
			return fmt.Errorf("%d ledger entries, want the worker's one charge", n)
		}
		return nil
	})
	stop()
	rec, _, err := r.store.Get(ctx, key)
	if err != nil || rec.State != kv.Completed {
		t.Fatalf("record: %+v %v; want COMPLETED", rec, err)
	}
	archived := intent.HashParts(key, rec.JobID)
	if _, err := r.store.Claim(ctx, archived, rec.Archived(key)); err != nil {
		t.Fatal(err)
	}

	// The next process sweeps with its clock past the grace: both records are billable.
	var offset atomic.Int64
	opts := r.opts
	opts.ID, opts.SweepEvery = "w2", time.Hour // swept by hand below
	opts.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	next := New(r.srv.JS, r.store, opts)
	offset.Store(int64(next.opts.ChargeGrace + time.Second))
	for i := 0; i < 2; i++ {
		if _, err := next.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	es := entries()
	if len(es) != 1 || es[0].JobID != first.JobID || es[0].KeyHash != key {
		for _, e := range es {
			t.Logf("entry %s key_hash %s job %s", e.ID, e.KeyHash, e.JobID)
		}
		t.Fatalf("%d ledger entries after the sweeps; want the one charge of job %s under key %s", len(es), first.JobID, key)
	}
}

// tenantEntries is every ledger entry of the crash rig's tenant.
func tenantEntries(t *testing.T, ctx context.Context, l *ledger.Ledger) []ledger.Entry {
	t.Helper()
	es, err := l.Entries(ctx, "t", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return es
}
