package workers_test

import (
	"context"
	"fmt"
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
	"github.com/oncegate/oncegate/workers"
)

// TestRedeliveredFinishedJobChargesOnce: a worker stored an outcome and charged it, then vanished
// before acking its job; the redelivered job finds the record finished and charges again. That
// charge is found in the ledger (from when the outcome was stored), even though this process's
// id index never saw it and the stream's Nats-Msg-Id window has passed: one entry, no execution.
func TestRedeliveredFinishedJobChargesOnce(t *testing.T) {
	r := resources(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := ledger.StreamConfig()
	cfg.Duplicates = 100 * time.Millisecond // passed before the redelivery: only the lookup can catch it
	if _, err := r.srv.JS.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	prices := ledger.Prices{"oncegate-mock": {InputPerMillion: 1_000_000}}

	rec, rev := r.claim(t, "done", `{"model":"oncegate-mock","messages":[{"role":"user","content":"d"}]}`, false)
	rec.LeaseUntil = time.Now().Add(-time.Second) // its worker is gone
	rev, err := r.store.Update(ctx, "done", rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	job := mustJob(t, "done", rec, rev) // the job as it was submitted, never acked
	final := *rec
	final.State, final.Request = kv.Completed, nil
	final.Result = &kv.Result{Status: http.StatusOK, Body: []byte(`{}`), Usage: &kv.Usage{PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10},
		Finished: time.Now(), Backend: "mock", Attempts: 1}
	if _, err := r.store.Update(ctx, "done", &final, rev); err != nil {
		t.Fatal(err)
	}
	// The vanished worker's charge (another process: its own ledger and index), then another
	// intent's, so that it is not the tenant's last entry either.
	gone := ledger.New(r.srv.JS, prices, "USD")
	in := ledger.ChargeInput{Tenant: final.Tenant, KeyHash: "done", JobID: final.JobID,
		Epoch: final.Epoch, Attempt: 1, Model: final.Model, Backend: "mock", InputTokens: 7, OutputTokens: 3, Completed: true}
	if _, err := gone.Charge(ctx, in); err != nil {
		t.Fatal(err)
	}
	in.KeyHash, in.JobID = "other", jobs.NewID()
	if _, err := gone.Charge(ctx, in); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the Nats-Msg-Id window: the time passing is what the test needs, not a synchronization

	l := ledger.New(r.srv.JS, prices, "USD", ledger.WithDedupHorizon(time.Nanosecond))
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "w2", Lease: time.Second, RenewEvery: 100 * time.Millisecond,
		Log: zerolog.Nop(), SweepEvery: -1, Ledger: l}))
	if err := jobs.Submit(ctx, r.srv.JS, job); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, r, "done", "the redelivered job")
	es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d ledger entries after the redelivery, want 2 (the charge and the other intent's): %+v", len(es), es)
	}
}

// ledgerRig is a rig with the LEDGER stream whose pool (if sweepEvery is not 0; negative:
// no sweeper) runs with the mock backend and charges the returned ledger (1 µ a token).
func ledgerRig(t *testing.T, sweepEvery time.Duration) (*rig, *ledger.Ledger) {
	t.Helper()
	r := resources(t)
	if err := ledger.EnsureStream(context.Background(), r.srv.JS); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(r.srv.JS, ledger.Prices{"*": {InputPerMillion: 1_000_000, OutputPerMillion: 1_000_000}}, "USD")
	mock, err := backend.New(config.Backend{Name: "mock", Type: config.TypeMock, Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 8}, Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.mock = mock
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "w1", Concurrency: 4, Lease: 2 * time.Second,
		RenewEvery: 200 * time.Millisecond, Backends: map[string]workers.Backend{"mock": mock}, Log: zerolog.Nop(),
		SweepEvery: sweepEvery, Ledger: l}))
	return r, l
}

// TestTakerCrashBeforeChargeIsCharged: a taker ran epoch 2 from the epoch-1 job message
// (a takeover on redelivery keeps the message), stored COMPLETED and died before charging.
// The message comes back; it looks stale (epoch 1, the record is at 2), but the record it
// names is finished: the worker charges it (before, it acked it and nothing charged).
func TestTakerCrashBeforeChargeIsCharged(t *testing.T) {
	r, l := ledgerRig(t, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "taker-died"
	rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"t"}]}`, false)
	rec.LeaseUntil = time.Now().Add(-time.Second)
	rev, err := r.store.Update(ctx, key, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	old := mustJob(t, key, rec, rev) // the message the taker worked from
	_, taken, trev, err := intent.TakeOver(ctx, r.srv.JS, r.store, key, rec, rev, time.Now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	final := *taken
	final.State, final.Request, final.RequestBytes = kv.Completed, nil, len(taken.Request)
	final.Result = &kv.Result{Status: http.StatusOK, Body: []byte(`{}`), Usage: &kv.Usage{PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10},
		Finished: time.Now(), Backend: "mock", Attempts: 1}
	if _, err := r.store.Update(ctx, key, &final, trev); err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, old); err != nil {
		t.Fatal(err)
	}
	waitEntries(t, l, 1, "the taker's outcome charged")
	waitAcked(t, r, key, "the old message")
	if es, err := l.Entries(ctx, "", time.Time{}, time.Time{}); err != nil || len(es) != 1 || es[0].Epoch != 2 || !es[0].Completed {
		t.Fatalf("entries %+v (%v); want one completed charge of epoch 2", es, err)
	}
	if n := r.mock.Mock().Stats().Requests; n != 0 {
		t.Fatalf("backend executions = %d, want 0", n)
	}
}

// TestTakeoverCountsAndChargesTheLostAttempt: epoch 1's worker sent its attempt (its progress
// says so) and vanished before renewing; the sweep takes the record over and epoch 2
// completes. The lost attempt is counted in the record (attempts 2, one unfinished epoch) and
// charged once, estimated and not completed; the reconciler then reverses it, as the charge
// of an epoch that lost its intent to a completed one: the tenant's net is one execution, the
// gateway's loss stays visible as the reversal.
func TestTakeoverCountsAndChargesTheLostAttempt(t *testing.T) {
	r, l := ledgerRig(t, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "lost-attempt"
	rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"lost"}]}`, false)
	// The vanished worker's last words: attempt 1 sent to the mock.
	if err := r.store.PutProgress(key, &kv.Progress{JobID: rec.JobID, Epoch: 1, Attempt: 1, Backend: "mock", Sent: time.Now()}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		p, err := r.store.Progress(ctx, rec.JobID, 1)
		if err != nil {
			return fmt.Errorf("progress never stored: %w", err)
		}
		if p.Attempt != 1 {
			return fmt.Errorf("progress names attempt %d, want 1", p.Attempt)
		}
		return nil
	})
	rec.LeaseUntil = time.Now().Add(-time.Second) // gone, and its job message with it
	if _, err := r.store.Update(ctx, key, rec, rev); err != nil {
		t.Fatal(err)
	}
	got := r.waitFinal(t, key)
	if got.State != kv.Completed || got.Epoch != 2 || got.Attempts != 2 || got.Takeovers != 1 ||
		len(got.Unfinished) != 1 || got.Unfinished[0].Epoch != 1 || got.Unfinished[0].Attempts != 1 {
		t.Fatalf("record after the takeover: state %s epoch %d attempts %d takeovers %d unfinished %+v; want COMPLETED, 2, 2, 1, epoch 1's attempt",
			got.State, got.Epoch, got.Attempts, got.Takeovers, got.Unfinished)
	}
	es := waitEntries(t, l, 2, "the lost attempt's and the completed one's charges")
	byEpoch := map[int]ledger.Entry{}
	for _, e := range es {
		byEpoch[e.Epoch] = e
	}
	lost, won := byEpoch[1], byEpoch[2]
	if len(es) != 2 || !lost.Estimated || lost.Completed || lost.Attempt != 1 || !won.Completed {
		t.Fatalf("entries %+v; want one estimated charge of epoch 1 and the completed charge of epoch 2", es)
	}
	rep, err := l.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Appended) != 1 || rep.Appended[0].Refers != lost.ID {
		t.Fatalf("reconcile appended %+v; want the reversal of %s", rep.Appended, lost.ID)
	}
}
