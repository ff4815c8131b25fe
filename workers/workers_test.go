package workers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
	"github.com/oncegate/oncegate/workers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type rig struct {
	srv   *testkit.JetStream
	store *kv.Store
	mock  *backend.Client
	pool  *workers.Pool // nil: none started
}

// resources starts an embedded server with the JOBS and CHUNKS streams and the IDEM bucket;
// the rig has no pool and no mock.
func resources(t *testing.T) *rig {
	t.Helper()
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	store, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{srv: srv, store: store}
}

// start runs a real pool against a real embedded server and the in-process mock backend.
func start(t *testing.T, sweepEvery time.Duration, mods ...func(*workers.Options)) *rig {
	t.Helper()
	r := resources(t)
	srv, store := r.srv, r.store
	mock, err := backend.New(config.Backend{Name: "mock", Type: config.TypeMock, Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 8},
		RetryBase: config.Duration(time.Millisecond), RetryCap: config.Duration(5 * time.Millisecond),
		Breaker: config.Breaker{MinRequests: 1000}}, nil) // the breaker has its own tests
	if err != nil {
		t.Fatal(err)
	}
	opts := workers.Options{ID: "w1", Concurrency: 4, Lease: 2 * time.Second,
		RenewEvery: 200 * time.Millisecond, Backends: map[string]workers.Backend{"mock": mock},
		Log: zerolog.Nop(), SweepEvery: sweepEvery}
	for _, mod := range mods {
		mod(&opts)
	}
	pool := workers.New(srv.JS, store, opts)
	run(t, pool)
	return &rig{srv: srv, store: store, mock: mock, pool: pool}
}

// run runs pool until the test ends, or until stop (which waits for Run to return).
func run(t *testing.T, pool *workers.Pool) (stop func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := pool.Run(runCtx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// claim creates a PENDING record for body and returns its key, record and revision.
func (r *rig) claim(t *testing.T, key, body string, stream bool) (*kv.Record, uint64) {
	t.Helper()
	return r.claimWith(t, key, body, func(rec *kv.Record) { rec.Stream = stream })
}

// claimWith is claim of a non-stream record that mod changes first.
func (r *rig) claimWith(t *testing.T, key, body string, mod func(*kv.Record)) (*kv.Record, uint64) {
	t.Helper()
	now := time.Now()
	rec := &kv.Record{State: kv.Pending, Tenant: "t", JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
		Created: now, EpochStarted: now, LeaseUntil: now.Add(2 * time.Second), Progress: kv.ProgressQueued,
		Model: "oncegate-mock", Backends: []string{"mock"}, Request: json.RawMessage(body)}
	mod(rec)
	rev, err := r.store.Claim(context.Background(), key, rec)
	if err != nil {
		t.Fatal(err)
	}
	return rec, rev
}

func (r *rig) waitFinal(t *testing.T, key string) *kv.Record {
	t.Helper()
	var rec *kv.Record
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		got, _, err := r.store.Get(context.Background(), key)
		if err != nil {
			return fmt.Errorf("record %s: %w", key, err)
		}
		if got.State == kv.Pending {
			return fmt.Errorf("record %s never left PENDING", key)
		}
		rec = got
		return nil
	})
	return rec
}

// waitAcked waits until key's job message (what names it in the failure) is no longer queued.
func waitAcked(t *testing.T, r *rig, key, what string) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		q, err := jobs.Queued(context.Background(), r.srv.JS, key)
		if err != nil {
			return fmt.Errorf("%s: queued: %w", what, err)
		}
		if q {
			return fmt.Errorf("%s was never acked", what)
		}
		return nil
	})
}

// waitEntries waits until the ledger holds at least n entries (what names them in the
// failure), and returns them.
func waitEntries(t *testing.T, l *ledger.Ledger, n int, what string) []ledger.Entry {
	t.Helper()
	var es []ledger.Entry
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		var err error
		if es, err = l.Entries(context.Background(), "", time.Time{}, time.Time{}); err != nil {
			return err
		}
		if len(es) < n {
			return fmt.Errorf("%d ledger entries %+v, want at least %d: %s", len(es), es, n, what)
		}
		return nil
	})
	return es
}

// TestOutcomes: what is stored for each kind of backend outcome.
func TestOutcomes(t *testing.T) {
	r := start(t, -1)
	cases := []struct {
		name       string
		body       string
		stream     bool
		state      kv.State
		status     int
		retryable  bool
		partial    bool
		wantEvents bool
	}{
		{"success non-stream", `{"model":"oncegate-mock","messages":[{"role":"user","content":"a"}]}`, false, kv.Completed, 200, false, false, false},
		{"success stream", `{"model":"oncegate-mock","messages":[{"role":"user","content":"b"}]}`, true, kv.Completed, 200, false, false, true},
		{"backend 400 is stored", `{"model":"oncegate-mock","messages":[{"role":"user","content":"c"}],"mock":{"fault":"error_400"}}`, false, kv.Completed, 400, false, false, false},
		{"backend 503 releases the key", `{"model":"oncegate-mock","messages":[{"role":"user","content":"d"}],"mock":{"fault":"error_503"}}`, false, kv.Failed, 503, true, false, false},
		{"backend 429 releases the key", `{"model":"oncegate-mock","messages":[{"role":"user","content":"e"}],"mock":{"fault":"rate_limit"}}`, true, kv.Failed, 429, true, false, false},
		{"stream broken after output keeps the partial", `{"model":"oncegate-mock","messages":[{"role":"user","content":"f"}],"mock":{"fault":"drop_after","fault_after":3}}`, true, kv.Failed, 200, false, true, true},
		// Broken before the first token on every attempt: nothing reached a client, the key is released.
		{"stream broken after the role chunk releases the key", `{"model":"oncegate-mock","messages":[{"role":"user","content":"g"}],"mock":{"fault":"drop_after","fault_after":0}}`, true, kv.Failed, 502, true, false, false},
		// The body was being written: the backend ran it. The outcome is kept, never re-run.
		{"non-stream body cut off keeps the outcome", `{"model":"oncegate-mock","messages":[{"role":"user","content":"h"}],"mock":{"fault":"drop_after","fault_after":0}}`, false, kv.Failed, 502, false, false, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "k" + string(rune('a'+i))
			rec, rev := r.claim(t, key, tc.body, tc.stream)
			hub := jobs.NewHub(r.srv.NC, r.srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
			defer hub.Close()
			fl, err := hub.Open(context.Background(), jobs.ChunkSubject(key, rec.JobID, 1))
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			if err := jobs.Submit(context.Background(), r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
				t.Fatal(err)
			}
			got := r.waitFinal(t, key)
			res := got.Result
			if got.State != tc.state || res.Status != tc.status || res.Retryable != tc.retryable || res.Partial != tc.partial {
				t.Fatalf("state %s status %d retryable %v partial %v", got.State, res.Status, res.Retryable, res.Partial)
			}
			if (len(res.Events) > 0) != tc.wantEvents {
				t.Fatalf("events stored: %d bytes", len(res.Events))
			}
			if got.Request != nil {
				t.Fatal("a finished record still carries the request")
			}
			// The terminal chunk comes after the record was written.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for {
				c, err := fl.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if c.Terminal() {
					break
				}
			}
		})
	}
}

// TestStaleJobIsDropped: a job whose epoch is behind its record never reaches the backend.
func TestStaleJobIsDropped(t *testing.T) {
	r := start(t, -1)
	rec, rev := r.claim(t, "stale", `{"model":"oncegate-mock","messages":[{"role":"user","content":"s"}]}`, false)
	rec.LeaseUntil = time.Now().Add(-time.Second)
	if _, err := r.store.Update(context.Background(), "stale", rec, rev); err != nil {
		t.Fatal(err)
	}
	cur, curRev, err := r.store.Get(context.Background(), "stale")
	if err != nil {
		t.Fatal(err)
	}
	old := mustJob(t, "stale", cur, curRev)
	if _, _, _, err := intent.TakeOver(context.Background(), r.srv.JS, r.store, "stale", cur, curRev, time.Now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(context.Background(), r.srv.JS, old); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, r, "stale", "the stale job")
	if n := r.mock.Mock().Stats().Requests; n != 0 {
		t.Fatalf("backend executions = %d, want 0", n)
	}
}

// TestSweepRedrivesLostJob: a PENDING record whose job message is gone (as after a NATS
// restart, JOBS being a memory stream) is taken over and completed by the sweeper: one lost
// before the pool's first sweep (which reads every key), one lost after it (found by a later
// sweep, which reads only the records written since).
func TestSweepRedrivesLostJob(t *testing.T) {
	r := start(t, 100*time.Millisecond)
	for i, key := range []string{"lost-before-first-sweep", "lost-after-it"} {
		rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"`+key+`"}]}`, false)
		rec.LeaseUntil = time.Now().Add(-time.Second) // its owner is gone, and no job was ever published
		if _, err := r.store.Update(context.Background(), key, rec, rev); err != nil {
			t.Fatal(err)
		}
		got := r.waitFinal(t, key)
		if got.State != kv.Completed || got.Epoch != 2 || got.Result.Status != http.StatusOK {
			t.Fatalf("%s after sweep: state %s epoch %d", key, got.State, got.Epoch)
		}
		if n := r.mock.Mock().Stats().Requests; n != int64(i+1) {
			t.Fatalf("%s: backend executions = %d, want %d", key, n, i+1)
		}
	}
}

// TestSweepAdmittedLate: the sweep re-drives a claim whose job was lost only when its API took
// it in time. A claim the store took after its AdmitBy (held in a client's reconnect buffer or a
// socket while the API refused the request with 503) is released, FAILED and retryable, and
// never reaches the backend: the refusal is binding.
func TestSweepAdmittedLate(t *testing.T) {
	cases := []struct {
		name     string
		admitBy  time.Duration // from the claim's write
		executed bool
	}{
		{"on-time", time.Minute, true},
		{"late", -time.Second, false},
		{"unset", 0, true}, // a record written before AdmitBy existed
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := start(t, 100*time.Millisecond)
			key := "admitted-" + tc.name
			now := time.Now()
			rec := &kv.Record{State: kv.Pending, Tenant: "t", JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
				Created: now, EpochStarted: now, LeaseUntil: now.Add(-time.Second), Progress: kv.ProgressQueued,
				Model: "oncegate-mock", Backends: []string{"mock"}, Request: json.RawMessage(`{"model":"oncegate-mock","messages":[{"role":"user","content":"late"}]}`)}
			if tc.admitBy != 0 {
				rec.AdmitBy = now.Add(tc.admitBy)
			}
			// Written straight to the bucket, as a buffered publish arrives: the store takes it
			// now, whatever its AdmitBy says (kv.Store.Claim would not try past it). No job was
			// published and the lease has run out.
			data, err := kv.Encode(rec)
			if err != nil {
				t.Fatal(err)
			}
			m := nats.NewMsg("$KV." + kv.Bucket + "." + key) // with the headers kv.Store's writes carry
			m.Data = data
			m.Header.Set("Og-State", string(kv.Pending))
			m.Header.Set("Og-Lease", strconv.FormatInt(rec.LeaseUntil.UnixMilli(), 10))
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			if _, err := r.srv.JS.PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
			got := r.waitFinal(t, key)
			if n := r.mock.Mock().Stats().Requests; (n == 1) != tc.executed || n > 1 {
				t.Fatalf("backend executions = %d, want executed=%v", n, tc.executed)
			}
			if tc.executed {
				if got.State != kv.Completed || got.Epoch != 2 {
					t.Fatalf("state %s epoch %d, want COMPLETED in epoch 2", got.State, got.Epoch)
				}
				return
			}
			if got.State != kv.Failed || got.Result == nil || !got.Result.Retryable || got.Epoch != 1 {
				t.Fatalf("state %s epoch %d result %+v, want a retryable FAILED epoch 1 (released)", got.State, got.Epoch, got.Result)
			}
		})
	}
}

// TestSweepLeavesQueuedJobs: an expired lease whose job is still in JOBS is not re-driven
// (the job will run or be redelivered), so a backed-up queue never doubles an execution.
func TestSweepLeavesQueuedJobs(t *testing.T) {
	r := resources(t)
	srv, store, ctx := r.srv, r.store, context.Background()
	rec, rev := r.claim(t, "queued", `{"model":"oncegate-mock","messages":[{"role":"user","content":"q"}]}`, false)
	rec.LeaseUntil = time.Now().Add(-time.Second)
	rev, err := store.Update(ctx, "queued", rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, srv.JS, mustJob(t, "queued", rec, rev)); err != nil {
		t.Fatal(err)
	}
	pool := workers.New(srv.JS, store, workers.Options{ID: "w", Lease: time.Second, RenewEvery: 100 * time.Millisecond, Log: zerolog.Nop()})
	n, err := pool.Sweep(ctx)
	if err != nil || n != 0 {
		t.Fatalf("sweep re-drove %d (err %v), want 0", n, err)
	}
	cur, _, err := store.Get(ctx, "queued")
	if err != nil || cur.Epoch != 1 {
		t.Fatalf("record changed: epoch %d err %v", cur.Epoch, err)
	}
}

// mustJob is the submittable job of rec stored at rev.
func mustJob(t *testing.T, key string, rec *kv.Record, rev uint64) *jobs.Job {
	t.Helper()
	job, err := intent.Job(key, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// TestChunkLinger: with a linger longer than the whole stream, the first token goes out alone
// and the rest is coalesced until the end, where nothing waits; the stored stream is the same
// as without a linger, which publishes about a chunk per token.
func TestChunkLinger(t *testing.T) {
	const body = `{"model":"oncegate-mock","stream":true,"messages":[{"role":"user","content":"linger"}],"mock":{"tokens":20,"inter_token_ms":10}}`
	final := map[time.Duration]*kv.Record{}
	for _, linger := range []time.Duration{0, 5 * time.Second} {
		r := start(t, -1, func(o *workers.Options) { o.ChunkLinger = linger })
		rec, rev := r.claim(t, "linger", body, true)
		if err := jobs.Submit(context.Background(), r.srv.JS, mustJob(t, "linger", rec, rev)); err != nil {
			t.Fatal(err)
		}
		final[linger] = r.waitFinal(t, "linger")
		if final[linger].State != kv.Completed {
			t.Fatalf("linger %s: %s %+v", linger, final[linger].State, final[linger].Result)
		}
	}
	off, on := final[0], final[5*time.Second]
	t.Logf("chunks: %d without a linger, %d with one", off.Chunks, on.Chunks)
	// Without a linger: the role chunk, 20 tokens, the finish chunk, the usage, give or take
	// what arrived during a publish. With it: the first event, then everything else at the end.
	if on.Chunks > 3 || on.Chunks >= off.Chunks {
		t.Fatalf("chunks with a linger: %d, without: %d; want at most 3 and fewer", on.Chunks, off.Chunks)
	}
	frames := func(rec *kv.Record) int { return bytes.Count(rec.Result.Events, []byte("\n\n")) }
	if frames(on) != frames(off) || frames(on) < 20 || !reflect.DeepEqual(on.Result.Usage, off.Result.Usage) {
		t.Fatalf("stored streams differ: %d frames and usage %+v with a linger, %d and %+v without",
			frames(on), on.Result.Usage, frames(off), off.Result.Usage)
	}
}
