package workers_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
	"github.com/oncegate/oncegate/workers"
)

// localRig is a pool with a ledger, the mock behind a gate, and a hub for local feeds.
type localRig struct {
	*rig
	pool   *workers.Pool
	ledger *ledger.Ledger
	gate   *gated
	hub    *jobs.Hub
	stop   func() // stops the pool (and waits for it)
}

func newLocalRig(t *testing.T, concurrency int) *localRig {
	t.Helper()
	r := resources(t)
	if err := ledger.EnsureStream(context.Background(), r.srv.JS); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(r.srv.JS, ledger.Prices{"*": {InputPerMillion: 1_000_000, OutputPerMillion: 1_000_000}}, "USD")
	mock, gate := newGated(t)
	r.mock = mock
	pool := workers.New(r.srv.JS, r.store, workers.Options{ID: "w1", Concurrency: concurrency, Lease: 2 * time.Second,
		RenewEvery: 200 * time.Millisecond, Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.Nop(),
		SweepEvery: -1, Ledger: l})
	stopPool := run(t, pool)
	t.Cleanup(gate.Open) // before the pool's stop (cleanups run last first): a failed test's execution ends
	stop := func() { gate.Open(); stopPool() }
	hub := jobs.NewHub(r.srv.NC, r.srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
	t.Cleanup(hub.Close)
	return &localRig{rig: r, pool: pool, ledger: l, gate: gate, hub: hub, stop: stop}
}

// runLocal starts rec's execution under key on the pool once it runs, with a local feed.
func (r *localRig) runLocal(t *testing.T, key string, rec *kv.Record) *jobs.Follower {
	t.Helper()
	fl, out, err := r.hub.Local(jobs.ChunkSubject(key, rec.JobID, rec.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if !r.pool.RunLocal(intent.JobOf(key, rec), rec, out) {
			return errors.New("the pool never took a local execution")
		}
		return nil
	})
	return fl
}

// TestRunLocal: an execution run for its one client where it was admitted delivers its
// answer through the local feed, a stream's tokens chunk by chunk, and leaves nothing in NATS
// but its ledger charge, written before the terminal chunk: no record, no progress, no job
// message, no chunk.
func TestRunLocal(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			r := newLocalRig(t, 2)
			r.gate.Open()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			key := "local-" + fmt.Sprint(stream)
			rec := pendingRecord(2*time.Second, "local")
			rec.Stream, rec.Bypassed = stream, true
			fl := r.runLocal(t, key, rec)
			defer fl.Close()
			var kinds []jobs.Kind
			var last jobs.Chunk
			for !last.Terminal() {
				ch, err := fl.Next(ctx)
				if err != nil {
					t.Fatalf("after chunks %v: %v", kinds, err)
				}
				kinds, last = append(kinds, ch.Kind), ch
			}
			// The charge is in the ledger by the time the terminal chunk is: read it at once.
			es, err := r.ledger.Entries(ctx, "", time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != 1 || es[0].JobID != rec.JobID || es[0].KeyHash != key {
				t.Fatalf("ledger entries when the terminal chunk came: %+v, want one charge of job %s", es, rec.JobID)
			}
			if stream {
				if last.Kind != jobs.KindDone || len(kinds) < 3 || kinds[0] != jobs.KindData {
					t.Fatalf("stream chunks %v, want data chunks then done", kinds)
				}
			} else if last.Kind != jobs.KindResult || last.Status != http.StatusOK || len(kinds) != 1 ||
				!strings.Contains(string(last.Payload), `"chat.completion"`) {
				t.Fatalf("chunks %v, last %s %d %s: want one result 200 with the completion", kinds, last.Kind, last.Status, last.Payload)
			}
			if last.Meta.Backend != "mock" || last.Meta.Attempts != 1 {
				t.Errorf("terminal chunk meta %+v, want backend mock, 1 attempt", last.Meta)
			}
			if n := r.mock.Mock().Stats().Requests; n != 1 {
				t.Errorf("%d backend requests, want 1", n)
			}
			if _, _, err := r.store.Get(ctx, key); !errors.Is(err, kv.ErrNotFound) {
				t.Errorf("record of a local execution: %v, want none", err)
			}
			if _, err := r.store.Progress(ctx, rec.JobID, rec.Epoch); !errors.Is(err, kv.ErrNotFound) {
				t.Errorf("progress of a local execution: %v, want none", err)
			}
			for _, name := range []string{jobs.JobsStream, jobs.ChunksStream} {
				st, err := r.srv.JS.Stream(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				info, err := st.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.State.LastSeq != 0 {
					t.Errorf("%s holds %d messages written: a local execution writes none", name, info.State.LastSeq)
				}
			}
		})
	}
}

// TestRunLocalRefused: RunLocal starts nothing and says so when every slot of the pool is
// taken, and once the pool is stopping; the execution it took runs to its end even when its
// client left, and the pool's stop waits for it.
func TestRunLocalRefused(t *testing.T) {
	r := newLocalRig(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rec := pendingRecord(2*time.Second, "busy")
	fl := r.runLocal(t, "busy", rec)
	<-r.gate.entered // the only slot is at the backend

	second := pendingRecord(2*time.Second, "refused")
	fl2, out2, err := r.hub.Local(jobs.ChunkSubject("refused", "job", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer fl2.Close()
	if r.pool.RunLocal(intent.JobOf("refused", second), second, out2) {
		t.Fatal("RunLocal took an execution with no free slot")
	}

	fl.Close() // the client leaves; the execution goes on to its answer and its charge
	r.stop()   // opens the gate, then waits for the pool, local executions included
	es, err := r.ledger.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].JobID != rec.JobID {
		t.Fatalf("ledger after the pool stopped: %+v, want the charge of job %s", es, rec.JobID)
	}
	if r.pool.RunLocal(intent.JobOf("refused", second), second, out2) {
		t.Fatal("RunLocal took an execution after the pool stopped")
	}
	if n := r.mock.Mock().Stats().Requests; n != 1 {
		t.Errorf("%d backend requests, want 1", n)
	}
}
