package workers_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

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
	time.Sleep(300 * time.Millisecond)

	l := ledger.New(r.srv.JS, prices, "USD", ledger.WithDedupHorizon(time.Nanosecond))
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "w2", Lease: time.Second, RenewEvery: 100 * time.Millisecond,
		Log: zerolog.Nop(), SweepEvery: -1, Ledger: l}))
	if err := jobs.Submit(ctx, r.srv.JS, job); err != nil {
		t.Fatal(err)
	}
	for q := true; q; {
		if ctx.Err() != nil {
			t.Fatal("the redelivered job was never acked")
		}
		time.Sleep(10 * time.Millisecond)
		q, _ = jobs.Queued(ctx, r.srv.JS, "done")
	}
	es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d ledger entries after the redelivery, want 2 (the charge and the other intent's): %+v", len(es), es)
	}
}
