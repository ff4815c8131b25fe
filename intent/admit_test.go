package intent_test

import (
	"context"
	"errors"
	"testing"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
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
			if c := next(t, adm); c.Idx != 0 || string(c.Payload) != "first" {
				t.Fatalf("follower read chunk %d %q", c.Idx, c.Payload)
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
