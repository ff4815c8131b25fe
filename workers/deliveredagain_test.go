package workers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestJobDeliveredAgainIsNotRunTwice: JetStream may deliver a job message again as a first
// delivery (NumDelivered 1) while a worker still runs it: a consumer's delivery count is not
// kept across a leader change (nats-server#5346), and a message stored twice (its submit's
// dedup lost to an election) is a new message. In the deployed row (issue 34) 12 of 13
// duplicate executions began seconds after an election, 3 of them on the node that had run
// the first execution and was still writing its outcome. A first delivery is trusted without
// a question only while it is fresh; here the copy reaches the pool that runs the job (fresh:
// the pool knows it runs the key), or another pool once it is older than that (it asks, and
// the owner answers). Either way the backend runs once, and the record ends COMPLETED by the
// owner in epoch 1.
func TestJobDeliveredAgainIsNotRunTwice(t *testing.T) {
	for _, tc := range []struct {
		name string
		// other: the copy goes to another pool, started once the copy is older than a fresh
		// job; the owner has stopped taking jobs (it drains, its execution goes on).
		other bool
	}{
		{name: "to the pool that runs it"},
		{name: "to another pool, later", other: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := resources(t)
			ctx := context.Background()
			mock, gate := newGated(t)
			defer gate.Open()
			var logs testkit.SyncBuffer
			const lease = 20 * time.Second
			stopOwner := run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "owner", Concurrency: 2, Lease: lease, RenewEvery: time.Second,
				Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.New(&logs).With().Str("pool", "owner").Logger(),
				SweepEvery: -1, ShutdownGrace: time.Minute}))

			key := "delivered-again-" + map[bool]string{false: "same", true: "other"}[tc.other]
			rec := pendingRecord(lease, tc.name)
			rev, err := r.store.Claim(ctx, key, rec)
			if err != nil {
				t.Fatal(err)
			}
			if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
				t.Fatal(err)
			}
			<-gate.entered // the owner runs it
			var drained chan struct{}
			if tc.other {
				drained = make(chan struct{})
				go func() { defer close(drained); stopOwner() }() // returns once the execution ends
				time.Sleep(200 * time.Millisecond)                // the owner's consumer has stopped
			}
			// The job message again, as JetStream stores a copy whose dedup was lost.
			st, err := r.srv.JS.Stream(ctx, jobs.JobsStream)
			if err != nil {
				t.Fatal(err)
			}
			orig, err := st.GetLastMsgForSubject(ctx, "jobs.run."+key)
			if err != nil {
				t.Fatal(err)
			}
			cp := nats.NewMsg(orig.Subject)
			cp.Header, cp.Data = orig.Header, orig.Data
			cp.Header.Set(jetstream.MsgIDHeader, key+".copy")
			if _, err := r.srv.JS.PublishMsg(ctx, cp); err != nil {
				t.Fatal(err)
			}
			var asked atomic.Int64
			sub, err := r.srv.NC.Subscribe(jobs.RunningSubject(key, 1), func(*nats.Msg) { asked.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			if tc.other {
				time.Sleep(1200 * time.Millisecond) // past a fresh job's second
				run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "taker", Concurrency: 2, Lease: lease, RenewEvery: time.Second,
					Backends: map[string]workers.Backend{"mock": mock}, Log: zerolog.New(&logs).With().Str("pool", "taker").Logger(),
					SweepEvery: -1}))
			}
			// The copy's delivery decided: asked (the fix), or a second execution began, or
			// (the owner's own pool) the copy is held back without a question.
			cons, err := r.srv.JS.Consumer(ctx, jobs.JobsStream, workers.ConsumerName)
			if err != nil {
				t.Fatal(err)
			}
			testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
				if mock.Mock().Stats().Requests > 0 || asked.Load() > 0 {
					return nil
				}
				info, err := cons.Info(ctx)
				if err != nil {
					return err
				}
				if !tc.other && info.Delivered.Consumer >= 2 {
					return nil
				}
				return fmt.Errorf("the copy not yet delivered (consumer delivered %d)", info.Delivered.Consumer)
			})
			time.Sleep(300 * time.Millisecond) // a second execution that began reaches the backend
			gate.Open()
			got := r.waitFinal(t, key)
			if drained != nil {
				<-drained
			}
			if got.State != kv.Completed || got.Epoch != 1 || got.Worker != "owner" {
				t.Fatalf("record %s epoch %d worker %q; want COMPLETED by the owner in epoch 1\n%s", got.State, got.Epoch, got.Worker, logs.String())
			}
			if n := mock.Mock().Stats().Requests; n != 1 {
				t.Fatalf("%d backend executions, want 1\n%s", n, logs.String())
			}
		})
	}
}
