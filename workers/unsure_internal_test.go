package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestLostRenewalAnswerIsNotAFence: a renewal failed unavailable, but had landed (its answer
// was lost in an election). The next write of the execution, expecting the old revision, meets
// a conflict against its own record: it recognises it, moves to that revision and writes, so
// the answer is stored instead of thrown away as "fenced". A conflict against another writer's
// record still fences.
func TestLostRenewalAnswerIsNotAFence(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	store, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pool := &Pool{store: store, opts: Options{ID: "w1", Lease: 10 * time.Second, Now: time.Now}}
	newExecution := func(key string) (*execution, *kv.Record) {
		now := time.Now()
		rec := &kv.Record{State: kv.Pending, Tenant: "t", JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
			Created: now, EpochStarted: now, LeaseUntil: now.Add(10 * time.Second), Model: "m"}
		rev, err := store.Claim(ctx, key, rec)
		if err != nil {
			t.Fatal(err)
		}
		return &execution{pool: pool, job: &jobs.Job{ID: rec.JobID, Key: key, Epoch: 1}, rec: rec, rev: rev, log: zerolog.Nop()}, rec
	}
	done := kv.Execution{Worker: "w1", Backend: "mock", Attempts: 1}
	res := &kv.Result{Status: http.StatusOK, Body: []byte(`{"answer":1}`)}

	t.Run("own renewal landed", func(t *testing.T) {
		ex, rec := newExecution("landed")
		renewed := rec.Renewed(time.Now(), 10*time.Second, "w1", 0, 0)
		if _, err := store.Update(ctx, "landed", renewed, ex.rev); err != nil { // its answer "lost"
			t.Fatal(err)
		}
		ex.unsure = []*kv.Record{renewed}
		if err := ex.update(ctx, rec.Completed(time.Now(), res, done), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("write after a landed renewal: %v, want it stored", err)
		}
		got, rev, err := store.Get(ctx, "landed")
		if err != nil || got.State != kv.Completed || rev != ex.rev || ex.unsure != nil {
			t.Fatalf("record %v at %d (execution at %d, unsure %v), err %v; want COMPLETED at the execution's revision",
				got.State, rev, ex.rev, ex.unsure != nil, err)
		}
	})
	t.Run("an older renewal landed", func(t *testing.T) {
		// Two renewals over the same revision failed unavailable; the first landed later
		// (pending on a server cut off from the others, committed after the heal).
		ex, rec := newExecution("older")
		first := rec.Renewed(time.Now(), 10*time.Second, "w1", 1, 1)
		second := rec.Renewed(time.Now().Add(time.Second), 10*time.Second, "w1", 2, 2)
		if _, err := store.Update(ctx, "older", first, ex.rev); err != nil {
			t.Fatal(err)
		}
		ex.unsure = []*kv.Record{first, second}
		if err := ex.update(ctx, rec.Completed(time.Now(), res, done), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("write after an older renewal landed: %v, want it stored (the record is ours)", err)
		}
		got, _, err := store.Get(ctx, "older")
		if err != nil || got.State != kv.Completed {
			t.Fatalf("record %v, err %v; want COMPLETED", got.State, err)
		}
	})
	t.Run("a renewal of ours that no unsure write matches", func(t *testing.T) {
		// The record moved on by a renewal of this execution whose bytes none of ex.unsure
		// holds (row 3b, at a partition's heal): still this epoch, PENDING, naming this
		// worker, so ours. With and without unsure writes.
		for _, unsure := range []bool{false, true} {
			key := fmt.Sprintf("own-%v", unsure)
			ex, rec := newExecution(key)
			ours := rec.Renewed(time.Now().Add(-time.Second), 10*time.Second, "w1", 3, 3)
			if _, err := store.Update(ctx, key, ours, ex.rev); err != nil {
				t.Fatal(err)
			}
			if unsure {
				ex.unsure = []*kv.Record{rec.Renewed(time.Now(), 10*time.Second, "w1", 4, 4)}
			}
			if err := ex.update(ctx, rec.Completed(time.Now(), res, done), time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("unsure %v: write over a renewal of ours: %v, want it stored", unsure, err)
			}
			got, _, err := store.Get(ctx, key)
			if err != nil || got.State != kv.Completed || ex.unsure != nil {
				t.Fatalf("unsure %v: record %v, err %v; want COMPLETED", unsure, got.State, err)
			}
		}
	})
	t.Run("another worker's renewal in this epoch fences", func(t *testing.T) {
		ex, rec := newExecution("other-worker")
		if _, err := store.Update(ctx, "other-worker", rec.Renewed(time.Now(), 10*time.Second, "w2", 0, 0), ex.rev); err != nil {
			t.Fatal(err)
		}
		if err := ex.update(ctx, rec.Completed(time.Now(), res, done), time.Now().Add(5*time.Second)); !errors.Is(err, kv.ErrConflict) {
			t.Fatalf("write over w2's record: %v, want ErrConflict", err)
		}
	})
	t.Run("another writer's record fences", func(t *testing.T) {
		ex, rec := newExecution("fenced")
		ex.unsure = []*kv.Record{rec.Renewed(time.Now(), 10*time.Second, "w1", 0, 0)} // never landed
		taken := rec.TakenOver(time.Now(), 10*time.Second, nil)
		if _, err := store.Update(ctx, "fenced", taken, ex.rev); err != nil {
			t.Fatal(err)
		}
		err := ex.update(ctx, rec.Completed(time.Now(), res, done), time.Now().Add(5*time.Second))
		if !errors.Is(err, kv.ErrConflict) {
			t.Fatalf("write after a takeover: %v, want ErrConflict", err)
		}
		got, _, _ := store.Get(ctx, "fenced")
		if got.State != kv.Pending || got.Epoch != 2 {
			t.Fatalf("record %s epoch %d, want the taker's PENDING epoch 2", got.State, got.Epoch)
		}
	})
}
