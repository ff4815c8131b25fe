package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// gated is the project's mock backend behind a gate: Send says it was called, then waits for
// the gate to open before the mock runs, so a test can break NATS while the execution is at
// the backend.
type gated struct {
	*backend.Client
	entered chan struct{} // closed by the first Send
	open    chan struct{} // closed by Open
	opened  sync.Once
}

// Open lets every Send through; a test defers it too, so that a failed test's pools can stop.
func (g *gated) Open() { g.opened.Do(func() { close(g.open) }) }

func (g *gated) Send(ctx context.Context, call *backend.Call) (*http.Response, context.CancelFunc, error) {
	select {
	case <-g.entered:
	default:
		close(g.entered)
	}
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("%w: %w", backend.ErrNotSent, ctx.Err())
	}
	return g.Client.Send(ctx, call)
}

// newGated is the mock backend (8 tokens) behind a closed gate.
func newGated(t *testing.T) (*backend.Client, *gated) {
	t.Helper()
	mock, err := backend.New(config.Backend{Name: "mock", Type: config.TypeMock, Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 8},
		Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return mock, &gated{Client: mock, entered: make(chan struct{}), open: make(chan struct{})}
}

// pendingRecord is a new intent's claim for the mock, asking content, with a lease from now.
func pendingRecord(lease time.Duration, content string) *kv.Record {
	now := time.Now()
	return &kv.Record{State: kv.Pending, Tenant: "t", JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
		Created: now, EpochStarted: now, LeaseUntil: now.Add(lease), Progress: kv.ProgressQueued,
		Model: "oncegate-mock", Backends: []string{"mock"},
		Request: json.RawMessage(`{"model":"oncegate-mock","messages":[{"role":"user","content":"` + content + `"}]}`)}
}

// TestCompletedSurvivesIDEMLeaderLoss: the IDEM bucket (R3) loses its leader, and its quorum,
// between the claim and the finish. The worker's COMPLETED write fails until a server comes
// back and a new leader is elected; the worker keeps trying (the same expected revision)
// while its lease lasts, and at least 30 s when the lease is shorter than that, so the record
// ends COMPLETED with the answer after one backend execution. Before, the worker gave the
// answer up after the first failed write: the record stayed PENDING until its lease ran out,
// and a taker executed it again; and then, with a lease shorter than the outage (the fault
// suite's 2 s), it gave up when the lease ended and took its own execution over on the job's
// redelivery (row 3a: 188 re-executions in 100 trials).
func TestCompletedSurvivesIDEMLeaderLoss(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease time.Duration
		tries int // COMPLETED writes seen before the servers come back
	}{
		{"lease longer than the outage", 20 * time.Second, 2},
		{"lease shorter than the outage", 2 * time.Second, 1},
	} {
		t.Run(tc.name, func(t *testing.T) { completedSurvivesLeaderLoss(t, tc.lease, tc.tries) })
	}
}

func completedSurvivesLeaderLoss(t *testing.T, lease time.Duration, tries int) {
	c := testkit.RunCluster(t, 3)
	_, js := c.Connect(t)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, js, jobs.StreamConfig{MaxChunkBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	store, err := kv.Open(ctx, js, kv.BucketConfig{TTL: time.Hour, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	mock, gate := newGated(t)
	var logs testkit.SyncBuffer
	_, wjs := c.Connect(t)
	run(t, workers.New(wjs, store, workers.Options{ID: "w1", Concurrency: 2, Lease: lease, RenewEvery: min(time.Second, lease/4),
		Backends: map[string]workers.Backend{"mock": gate}, Log: zerolog.New(&logs), SweepEvery: -1}))

	const key = "election-completed"
	rec := pendingRecord(lease, "ride out an election")
	rev, err := store.Claim(ctx, key, rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, js, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	<-gate.entered

	// Take the bucket's leader and one more server away: no quorum, no writes, until one
	// comes back and a leader is elected (a crash's 4-9 s election, made certain).
	leader, other, survivor := c.LoseQuorum("KV_" + kv.Bucket)
	// The worker's writes are plain messages on the record's subject: the survivor's watcher
	// sees every COMPLETED write the worker sends, applied or not.
	watched := c.Watch(survivor, "$KV."+kv.Bucket+"."+key)
	gate.Open()
	waitCompletedTries(t, watched, tries)

	c.Restart(other)
	c.Restart(leader) // three candidates elect sooner than two
	var got *kv.Record
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		r, _, err := store.Get(ctx, key)
		if err != nil {
			return err
		}
		if r.State == kv.Pending {
			return fmt.Errorf("record still PENDING")
		}
		got = r
		return nil
	})
	if got.State != kv.Completed || got.Result == nil || got.Result.Status != http.StatusOK ||
		!strings.Contains(string(got.Result.Body), "chat.completion") {
		t.Fatalf("record %s, result %+v; want COMPLETED with the answer\n%s", got.State, got.Result, logs.String())
	}
	if n := mock.Mock().Stats().Requests; n != 1 {
		t.Fatalf("%d backend executions, want 1\n%s", n, logs.String())
	}
	if got.Epoch != 1 || got.Worker != "w1" {
		t.Errorf("epoch %d worker %q, want the first epoch's worker w1", got.Epoch, got.Worker)
	}
}

// waitCompletedTries waits until the worker has sent n COMPLETED writes. The watcher is itself
// a responder on the subject, so a write never gets "no responders" (which nats.go retries
// itself): each try is one request that waits for its deadline, and a second one is the worker
// trying again.
func waitCompletedTries(t *testing.T, tries <-chan *nats.Msg, n int) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	seen := 0
	for seen < n {
		select {
		case m := <-tries:
			if m.Header.Get("Og-State") == string(kv.Completed) {
				seen++
			}
		case <-deadline:
			t.Fatalf("the worker sent %d COMPLETED writes while NATS had no quorum, want %d: it gave up", seen, n)
		}
	}
}
