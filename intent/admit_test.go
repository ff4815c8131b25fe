package intent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

// TestAdmitStates: each row of DESIGN's "States of a key" table, what a new request with the
// key is attached to, what the record then says, and whether a job was published for it.
func TestAdmitStates(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		seed   seed // nil: the key has no record
		bypass bool
		want   intent.Outcome
		state  kv.State
		epoch  int
		// sameJob: the answer names the seed's job id.
		sameJob bool
		// jobs is how many jobs this Admit published.
		jobs int
	}{
		{name: "no record claims", want: intent.Created, state: kv.Pending, epoch: 1, jobs: 1},
		{name: "PENDING joins", seed: pending, want: intent.Joined, state: kv.Pending, epoch: 1, sameJob: true},
		{name: "COMPLETED replays", seed: completed, want: intent.Replayed, state: kv.Completed, epoch: 1, sameJob: true},
		{name: "FAILED retryable reclaims", seed: retryable, want: intent.Created, state: kv.Pending, epoch: 2, sameJob: true, jobs: 1},
		{name: "FAILED permanent replays", seed: permanent, want: intent.Replayed, state: kv.Failed, epoch: 1, sameJob: true},
		{name: "FAILED cancelled replays", seed: cancelled, want: intent.Replayed, state: kv.Failed, epoch: 1, sameJob: true},
		{name: "bypass has a record of its own", seed: pending, bypass: true, want: intent.Bypassed, state: kv.Pending, epoch: 1, jobs: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t.Name())
			req.Bypass = tc.bypass
			var before *intent.Admission
			if tc.seed != nil {
				before = tc.seed(t, e, req)
			}
			e.jobs.count(t, "")
			adm := admit(t, e.core, req)
			if adm.Outcome != tc.want {
				t.Fatalf("outcome %s, want %s", adm.Outcome, tc.want)
			}
			rec, _ := e.get(t, adm.Key)
			if rec.State != tc.state || rec.Epoch != tc.epoch || adm.Rec.Epoch != tc.epoch {
				t.Fatalf("record %s epoch %d (admission's epoch %d), want %s epoch %d", rec.State, rec.Epoch, adm.Rec.Epoch, tc.state, tc.epoch)
			}
			if rec.JobID != adm.JobID {
				t.Fatalf("admission names job %s, the record %s", adm.JobID, rec.JobID)
			}
			if before != nil && (adm.JobID == before.JobID) != tc.sameJob {
				t.Fatalf("job %s after %s: same job = %v, want %v", adm.JobID, before.JobID, !tc.sameJob, tc.sameJob)
			}
			if n := e.jobs.count(t, ""); n != tc.jobs {
				t.Fatalf("%d jobs published, want %d", n, tc.jobs)
			}
			if tc.bypass {
				if adm.Key == req.Key || adm.Key == before.Key {
					t.Fatalf("bypass used key %s (client's %s, first bypass's %s)", adm.Key, req.Key, before.Key)
				}
				e.take(t, before.Key) // the first bypass's own job
			}
			if tc.jobs == 1 {
				if job := e.take(t, adm.Key); job.ID != adm.JobID || job.Epoch != tc.epoch {
					t.Fatalf("JOBS holds job %s epoch %d, want %s epoch %d", job.ID, job.Epoch, adm.JobID, tc.epoch)
				}
			}
			if tc.want == intent.Replayed {
				if adm.Follower() != nil {
					t.Fatal("a replay follows an execution")
				}
				return
			}
			// The follower is open on the execution: the worker's first chunk reaches it.
			if err := e.publisher(t, adm.Key).Publish(context.Background(), jobs.KindData, 0, []byte("first")); err != nil {
				t.Fatal(err)
			}
			if c := next(t, adm); c.Index() != 0 || string(c.Payload()) != "first" {
				t.Fatalf("follower read chunk %d %q", c.Index(), c.Payload())
			}
		})
	}
}

// TestAdmitConflicts: a key whose record holds another request, or another tenant's record,
// is refused, and the record is left as it was.
func TestAdmitConflicts(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		seed   seed
		change func(*intent.Request)
		want   error
	}{
		{"another body, PENDING", pending, func(r *intent.Request) { r.Fingerprint = "another" }, intent.ErrKeyReused},
		{"another body, COMPLETED", completed, func(r *intent.Request) { r.Fingerprint = "another" }, intent.ErrKeyReused},
		{"another body, FAILED retryable", retryable, func(r *intent.Request) { r.Fingerprint = "another" }, intent.ErrKeyReused},
		// Only a crafted "auto-" key names a record of another tenant.
		{"another tenant's record", completed, func(r *intent.Request) { r.Tenant = "globex" }, intent.ErrKeyForeign},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t.Name())
			tc.seed(t, e, req)
			_, rev := e.get(t, req.Key)
			other := *req
			tc.change(&other)
			e.jobs.count(t, "")
			adm, err := e.core.Admit(context.Background(), &other)
			if !errors.Is(err, tc.want) {
				t.Fatalf("admit: %v (%v), want %v", err, adm, tc.want)
			}
			if _, now := e.get(t, req.Key); now != rev {
				t.Fatalf("record moved from revision %d to %d", rev, now)
			}
			if n := e.jobs.count(t, ""); n != 0 {
				t.Fatalf("%d jobs published", n)
			}
		})
	}
}

// TestAutoKeyWindow: a request without a key is a copy of an identical one inside the window
// (or when it declares itself a retry), and a new intent after it; the finished execution an
// auto key moves on from stays reachable by its job id.
func TestAutoKeyWindow(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name     string
		seed     seed
		finished bool          // the seed is completed
		later    time.Duration // clock moved after the first request
		retry    bool
		want     intent.Outcome
		// newIntent: a new job, not the first request's.
		newIntent bool
		// arrivedWithFirst: the second request reached the gateway when the first was
		// admitted, and the store answered it only after the window (a claim that stalled in
		// an election while its SDK retry created the record on another node).
		arrivedWithFirst bool
	}{
		{name: "inside the window joins", seed: pending, later: autoWindow / 2, want: intent.Joined},
		{name: "inside the window replays", seed: completed, later: autoWindow / 2, want: intent.Replayed},
		{name: "after the window, finished: new intent", seed: completed, finished: true, later: autoWindow + time.Second, want: intent.Created, newIntent: true},
		{name: "after the window, running: new intent", seed: pending, later: autoWindow + time.Second, want: intent.Created, newIntent: true},
		{name: "declared retry after the window replays", seed: completed, later: autoWindow + time.Second, retry: true, want: intent.Replayed},
		{name: "declared retry after the window joins", seed: pending, later: autoWindow + time.Second, retry: true, want: intent.Joined},
		{name: "arrived inside the window, admitted after it, joins", seed: pending, later: autoWindow + time.Second, arrivedWithFirst: true, want: intent.Joined},
		{name: "arrived inside the window, admitted after it, replays", seed: completed, finished: true, later: autoWindow + time.Second, arrivedWithFirst: true, want: intent.Replayed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := autoRequest(t.Name())
			first := tc.seed(t, e, req)
			seeded := e.clock.Now()
			e.clock.Add(tc.later)
			again := *req
			again.Retry = tc.retry
			if tc.arrivedWithFirst {
				again.Arrived = seeded
			}
			adm := admit(t, e.core, &again)
			if adm.Outcome != tc.want || (adm.JobID != first.JobID) != tc.newIntent {
				t.Fatalf("%s job %s after job %s; want %s, new intent %v", adm.Outcome, adm.JobID, first.JobID, tc.want, tc.newIntent)
			}
			if !tc.newIntent {
				return
			}
			// The first execution is still found by its id, as it stands (a finished one was
			// archived under a key of its own before the auto key moved on).
			wantState := kv.Pending
			if tc.finished {
				wantState = kv.Completed
			} else {
				// A running synchronous job is found through its progress, which its worker
				// writes at the send (there is no worker here): an id still queued is unknown.
				if _, _, _, err := e.core.FindJob(context.Background(), tenant, first.JobID); !errors.Is(err, intent.ErrNoJob) {
					t.Fatalf("a queued synchronous job found by its id: %v, want ErrNoJob", err)
				}
				if err := e.store.PutProgress(first.Key, &kv.Progress{JobID: first.JobID, Epoch: first.Rec.Epoch, Attempt: 1, Backend: "mock", Sent: e.clock.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			var found *kv.Record
			testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { // progress is written asynchronously
				var err error
				_, found, _, err = e.core.FindJob(context.Background(), tenant, first.JobID)
				return err
			})
			if found.JobID != first.JobID || found.Fingerprint != req.Fingerprint || found.State != wantState {
				t.Fatalf("job %s found as %s %+v, want %s", first.JobID, found.State, found, wantState)
			}
			// An archived copy is charged under the key its execution ran under (the same
			// ledger ids as the original's charge), never under its own.
			if tc.finished && found.ChargedUnder("the copy's own key") != req.Key {
				t.Fatalf("archived copy is charged under %q, want the auto key %q", found.ChargedUnder("the copy's own key"), req.Key)
			}
		})
	}
}

// TestReplayCache: the final record of an explicit key, once replayed, is served again
// without a JetStream read or write. The proof is a core subscription to the bucket's
// direct-get subject (every record read, from any connection) and to its write subjects.
// Auto keys and retryable failures are read every time.
func TestReplayCache(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name string
		auto bool
		seed seed
		// between runs after the first Admit (a worker finishing what it reclaimed).
		between      func(t *testing.T, e *env, key string)
		first, again intent.Outcome
		cached       bool
	}{
		{name: "explicit key, COMPLETED", seed: completed, first: intent.Replayed, again: intent.Replayed, cached: true},
		{name: "explicit key, permanent failure", seed: permanent, first: intent.Replayed, again: intent.Replayed, cached: true},
		{name: "explicit key, cancelled", seed: cancelled, first: intent.Replayed, again: intent.Replayed, cached: true},
		{name: "auto key, COMPLETED", auto: true, seed: completed, first: intent.Replayed, again: intent.Replayed},
		{name: "explicit key, retryable failure", seed: retryable, first: intent.Created, again: intent.Created,
			between: func(t *testing.T, e *env, key string) {
				e.take(t, key)
				e.finish(t, key, kv.Failed, kv.Result{Status: 503, Retryable: true})
				// Until the node's feed has the terminal chunk, a copy joins that feed (and
				// gets the failure) instead of deciding again: wait for the feed to end.
				reclaimed, _ := e.get(t, key) // a retryable failure is reclaimed under its job id
				subject := jobs.ChunkSubject(key, reclaimed.JobID, 2)
				testkit.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
					if e.hub.Following(subject) {
						return errors.New("the node still follows " + subject)
					}
					return nil
				})
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t.Name())
			if tc.auto {
				req = autoRequest(t.Name())
			}
			tc.seed(t, e, req)
			if adm := admit(t, e.core, req); adm.Outcome != tc.first {
				t.Fatalf("first: %s, want %s", adm.Outcome, tc.first)
			}
			if tc.between != nil {
				tc.between(t, e, req.Key)
			}
			e.reads.count(t, req.Key)
			e.records.count(t, req.Key)
			adm := admit(t, e.core, req)
			reads, writes := e.reads.count(t, req.Key), e.records.count(t, req.Key)
			if adm.Outcome != tc.again {
				t.Fatalf("again: %s, want %s", adm.Outcome, tc.again)
			}
			if cached := reads == 0 && writes == 0; cached != tc.cached {
				t.Fatalf("the second Admit read the record %d times and wrote it %d times; cached = %v, want %v", reads, writes, cached, tc.cached)
			}
		})
	}
}

// TestLiveJoin: a copy of an execution this node follows joins its feed without a claim
// attempt or a record read, while the lease it remembers runs; afterwards (or once the node
// no longer follows it) the record decides again.
func TestLiveJoin(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		before func(first *intent.Admission) // after the first request
		// local: joined from memory (no claim attempt, no record read).
		local bool
	}{
		{name: "followed, lease running", before: func(*intent.Admission) {}, local: true},
		{name: "remembered lease ran out", before: func(*intent.Admission) { e.clock.Add(lease + time.Second) }},
		{name: "no longer followed", before: func(first *intent.Admission) { first.Close() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t.Name())
			first := admit(t, e.core, req)
			tc.before(first)
			e.reads.count(t, req.Key)
			e.records.count(t, req.Key)
			adm := admit(t, e.core, req)
			reads, writes := e.reads.count(t, req.Key), e.records.count(t, req.Key)
			if adm.Outcome != intent.Joined || adm.JobID != first.JobID || adm.Rec.Epoch != 1 {
				t.Fatalf("%s job %s epoch %d, want joined job %s epoch 1", adm.Outcome, adm.JobID, adm.Rec.Epoch, first.JobID)
			}
			if local := reads == 0 && writes == 0; local != tc.local {
				t.Fatalf("%d record reads and %d claim attempts; local join = %v, want %v", reads, writes, local, tc.local)
			}
			if err := e.publisher(t, req.Key).Publish(context.Background(), jobs.KindData, 0, []byte("tok")); err != nil {
				t.Fatal(err)
			}
			if c := next(t, adm); string(c.Payload()) != "tok" {
				t.Fatalf("joined follower read %q", c.Payload())
			}
		})
	}
}

// TestBudgetAdmission: a refused budget stops a new execution before anything is written;
// a copy of an existing intent is never refused.
func TestBudgetAdmission(t *testing.T) {
	b := &budget{}
	e := newEnv(t, b)
	cases := []struct {
		name   string
		seed   seed // nil: no record
		bypass bool
		want   intent.Outcome // "" : refused
	}{
		{name: "no record: refused", want: ""},
		{name: "bypass: refused", bypass: true, want: ""},
		{name: "retryable failure re-executes: refused", seed: retryable, want: ""},
		{name: "PENDING joins", seed: pending, want: intent.Joined},
		{name: "COMPLETED replays", seed: completed, want: intent.Replayed},
		{name: "permanent failure replays", seed: permanent, want: intent.Replayed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t.Name())
			req.Bypass = tc.bypass
			b.refuse.Store(false)
			var rev uint64
			if tc.seed != nil {
				tc.seed(t, e, req)
				_, rev = e.get(t, req.Key)
			}
			b.refuse.Store(true)
			e.jobs.count(t, "")
			e.records.count(t, "")
			adm, err := e.core.Admit(context.Background(), req)
			jobsPublished, writes := e.jobs.count(t, ""), e.records.count(t, "")
			if tc.want != "" {
				if err != nil || adm.Outcome != tc.want {
					t.Fatalf("admit: %v %v, want %s", adm, err, tc.want)
				}
				adm.Close()
				return
			}
			if !errors.Is(err, ledger.ErrBudgetExceeded) {
				t.Fatalf("admit: %v %v, want ErrBudgetExceeded", adm, err)
			}
			if writes != 0 || jobsPublished != 0 {
				t.Fatalf("refused, yet %d record writes and %d jobs", writes, jobsPublished)
			}
			_, now, err := e.store.Get(context.Background(), req.Key)
			if tc.seed == nil && !errors.Is(err, kv.ErrNotFound) {
				t.Fatalf("refused request left a record (rev %d, %v)", now, err)
			}
			if tc.seed != nil && now != rev {
				t.Fatalf("record moved from revision %d to %d", rev, now)
			}
		})
	}
}

// TestNextReadsTheRecordWhenTheChunkNeverComes: the execution's record is COMPLETED but its
// terminal chunk was never written (the worker died between the two, or the follower's
// consumer lost it). A copy waiting on the chunks reads the record after a silence and
// answers from it, instead of waiting until its deadline.
func TestNextReadsTheRecordWhenTheChunkNeverComes(t *testing.T) {
	e := newEnv(t, nil)
	adm := admit(t, e.core, request("silent-end"))
	if adm.Outcome != intent.Created {
		t.Fatalf("outcome %v, want created", adm.Outcome)
	}
	e.take(t, adm.Key)
	e.finishRecord(t, adm.Key, kv.Completed, kv.Result{Status: http.StatusOK, Body: []byte(`{"id":"x"}`)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := nextEvent(ctx, adm)
	if err != nil || ev.Kind != intent.Finished || adm.Rec.State != kv.Completed || string(adm.Rec.Result.Body) != `{"id":"x"}` ||
		string(ev.View.Answer.Body) != `{"id":"x"}` {
		t.Fatalf("next: %v %v, record %+v; want Finished with the COMPLETED record", ev.Kind, err, adm.Rec)
	}
}

// TestStaleReadIsConfirmedByTheLeader: a claim refused for a key is decided on the record a
// replica answers, and a replica that has not caught up (row 3b, after a partition's heal)
// answers PENDING for an intent that has finished. Before this node follows the execution the
// leader is asked, so the copy is replayed with the stored answer, not joined.
func TestStaleReadIsConfirmedByTheLeader(t *testing.T) {
	e := newEnv(t, nil)
	req := request(t.Name())
	adm := pending(t, e, req)
	stale, staleRev := e.get(t, adm.Key)
	e.take(t, adm.Key)
	body := []byte(`{"choices":[]}`)
	e.finish(t, adm.Key, kv.Completed, kv.Result{Status: 200, Body: body})
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if e.hub.Following(jobs.ChunkSubject(adm.Key, stale.JobID, stale.Epoch)) {
			return fmt.Errorf("the node still follows the execution")
		}
		return nil
	})

	got, err := e.core.AttachHeld(context.Background(), req, stale, staleRev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(got.Close)
	if got.Outcome != intent.Replayed || got.Rec.State != kv.Completed || !bytes.Equal(got.Rec.Result.Body, body) {
		t.Fatalf("a copy decided on a stale PENDING record: %s, record %s, want replayed with the stored answer", got.Outcome, got.Rec.State)
	}
	if got.Follower() != nil {
		t.Fatal("the replay follows the execution")
	}
}
