package intent_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// localRunner plays a node's workers for the local path: it answers at once on the feed it is
// given (as a worker would, from its own goroutine), or refuses (no free slot).
type localRunner struct {
	refuse bool
	runs   []*jobs.Job
}

func (r *localRunner) RunLocal(job *jobs.Job, rec *kv.Record, out *jobs.LocalPublisher) bool {
	if r.refuse {
		return false
	}
	r.runs = append(r.runs, job)
	out.SetMeta(jobs.Meta{Backend: "mock", Attempts: 1})
	_ = out.Publish(context.Background(), jobs.KindResult, http.StatusOK, []byte(`{"answer":"`+rec.JobID+`"}`))
	return true
}

// TestBypassRunsLocally: a bypassed request on a node with workers runs there with no record,
// job or chunk written, its answer on the admission's feed; a background or retrievable one
// (its job id is a handle) and one the workers refuse take the job path, the refused one with
// the reservation of its first try given back (MaxExecutions 1 still admits it).
func TestBypassRunsLocally(t *testing.T) {
	cases := []struct {
		name               string
		async, retrievable bool
		refuse             bool
		local              bool
	}{
		{name: "sync runs locally", local: true},
		{name: "async takes the job path", async: true},
		{name: "retrievable takes the job path", retrievable: true},
		{name: "refused by the workers takes the job path", refuse: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			runner := &localRunner{refuse: tc.refuse}
			core := e.otherNode(t, bounds(1, 0, nil), func(d *intent.Deps) { d.Local = runner })
			req := request("bypass-local")
			req.Bypass, req.Async, req.Retrievable = true, tc.async, tc.retrievable
			e.records.count(t, "")
			e.jobs.count(t, "")
			adm := admit(t, core, req)
			if adm.Outcome != intent.Bypassed || adm.Local() != tc.local {
				t.Fatalf("outcome %s, local %v; want bypassed, local %v", adm.Outcome, adm.Local(), tc.local)
			}
			records, published := e.records.count(t, ""), e.jobs.count(t, "")
			_, _, err := e.store.Get(context.Background(), adm.Key)
			if !tc.local {
				if err != nil || published != 1 || len(runner.runs) != 0 {
					t.Fatalf("job path: record %v, %d jobs, %d local runs; want a record, 1 job, no local run", err, published, len(runner.runs))
				}
				return
			}
			if !errors.Is(err, kv.ErrNotFound) || records != 0 || published != 0 {
				t.Fatalf("local run: record %v, %d record writes, %d jobs; want none of them", err, records, published)
			}
			if len(runner.runs) != 1 || runner.runs[0].Key != adm.Key || runner.runs[0].ID != adm.JobID ||
				string(runner.runs[0].Body) != string(req.Body) || runner.runs[0].Epoch != 1 {
				t.Fatalf("local runs %+v, want one of job %s under key %s with the request", runner.runs, adm.JobID, adm.Key)
			}
			if c := next(t, adm); c.Kind != intent.Result || string(c.Payload()) != `{"answer":"`+adm.JobID+`"}` {
				t.Fatalf("first chunk %s %q, want the runner's result", c.Kind, c.Payload())
			}
			if _, err := nextEvent(context.Background(), adm); !errors.Is(err, intent.ErrInterrupted) {
				t.Fatalf("Next after the terminal chunk: %v, want ErrInterrupted (no record to read)", err)
			}
		})
	}
}
