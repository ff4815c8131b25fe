package workers_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestDeadOwnerIsTakenOverBeforeItsLease: the pool running an execution dies (its connection
// closes, as a killed process's does) after sending its attempt. Its job message, no longer
// kept in progress, is redelivered to the other pool after the JOBS ack wait; that pool finds
// the owner the epoch's progress names gone (no responders on its presence subject) and takes
// the execution over at once, counting the sent attempt, instead of waiting out a one-minute
// lease (issue 34: a killed worker's intents waited the whole lease, then ran again).
func TestDeadOwnerIsTakenOverBeforeItsLease(t *testing.T) {
	r := resources(t)
	ctx := context.Background()
	const lease = time.Minute
	var logs testkit.SyncBuffer
	ownerNC, _, gate := startDoomed(t, r, lease, &logs)
	defer gate.Open()

	const key = "dead-owner"
	rec := pendingRecord(lease, "the owner dies")
	rev, err := r.store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	sentByDoomed(t, r, gate, rec)
	ownerNC.Close() // the process is gone: its presence, heartbeats and writes with it

	mock, _ := newGated(t)
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "taker", Concurrency: 2, Lease: lease, RenewEvery: 20 * time.Second,
		Backends: map[string]workers.Backend{"mock": mock}, Log: zerolog.New(&logs).With().Str("pool", "taker").Logger(), SweepEvery: -1}))
	takenOverEarly(t, r, key, rec, &logs)
}

// startDoomed runs the pool "doomed" on a connection of its own, which the test closes to kill
// it; its backend holds every call until gate opens.
func startDoomed(t *testing.T, r *rig, lease time.Duration, logs io.Writer) (*nats.Conn, *workers.Pool, *gated) {
	t.Helper()
	_, gate := newGated(t)
	nc, js := r.srv.Conn(t)
	store, err := kv.Open(context.Background(), js, kv.BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pool := workers.New(js, store, workers.Options{ID: "doomed", Concurrency: 2, Lease: lease, RenewEvery: 20 * time.Second,
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.New(logs).With().Str("pool", "doomed").Logger(),
		SweepEvery: -1, ShutdownGrace: time.Millisecond})
	run(t, pool)
	return nc, pool, gate
}

// sentByDoomed waits until the pool "doomed" sent the attempt of rec's epoch 1 to gate and
// wrote its progress.
func sentByDoomed(t *testing.T, r *rig, gate *gated, rec *kv.Record) {
	t.Helper()
	<-gate.entered
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		p, err := r.store.Progress(context.Background(), rec.JobID, 1)
		if err != nil || p.Worker != "doomed" || p.Attempt != 1 {
			return fmt.Errorf("progress of the sent attempt: %+v %v", p, err)
		}
		return nil
	})
}

// takenOverEarly waits until the record of key, claimed as rec by a pool that died after
// sending its attempt, is finished by the pool "taker", and checks that it took the execution
// over in epoch 2 before rec's lease ran out, counting the dead pool's sent attempt.
func takenOverEarly(t *testing.T, r *rig, key string, rec *kv.Record, logs fmt.Stringer) {
	t.Helper()
	got := finished(t, r, key)
	if got.State != kv.Completed || got.Epoch != 2 || got.Worker != "taker" || got.Takeovers != 1 || got.Result == nil || got.Result.Status != http.StatusOK {
		t.Fatalf("record %s epoch %d worker %q takeovers %d result %+v; want COMPLETED by the taker in epoch 2\n%s",
			got.State, got.Epoch, got.Worker, got.Takeovers, got.Result, logs.String())
	}
	if !got.EpochStarted.Before(rec.LeaseUntil) {
		t.Fatalf("taken over at %s, after the dead owner's lease ran out (%s)", got.EpochStarted, rec.LeaseUntil)
	}
	if len(got.Unfinished) != 1 || got.Unfinished[0].Epoch != 1 || got.Attempts != 2 {
		t.Fatalf("unfinished %+v, attempts %d: want the dead owner's sent attempt counted", got.Unfinished, got.Attempts)
	}
}

// finished waits until the record of key is no longer PENDING, and returns it.
func finished(t *testing.T, r *rig, key string) *kv.Record {
	t.Helper()
	var got *kv.Record
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		cur, _, err := r.store.Get(context.Background(), key)
		if err != nil || cur.State == kv.Pending {
			return fmt.Errorf("record %+v %v, want it finished", cur, err)
		}
		got = cur
		return nil
	})
	return got
}
