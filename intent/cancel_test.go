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

// TestCancel: a queued or running job becomes FAILED and cancelled with the 409 body given,
// its followers get that error and its worker is fenced; a finished job is left as it is; a
// job id of another tenant, or no job id at all, is no job.
func TestCancel(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name   string
		finish bool   // a worker finished the job first
		tenant string // who cancels
		id     func(jobID string) string
		want   error
	}{
		{name: "queued job is cancelled", tenant: tenant},
		{name: "finished job is left as it is", finish: true, tenant: tenant},
		{name: "another tenant's job", tenant: "globex", want: intent.ErrNoJob},
		{name: "malformed id", tenant: tenant, id: func(string) string { return "not-a-ulid" }, want: intent.ErrNoJob},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			req := request(t.Name())
			req.Async = true // a background job: its id is the client's handle
			adm := admit(t, e.core, req)
			job := e.take(t, req.Key) // a worker runs it
			pub := jobs.NewPublisher(e.srv.JS, job)
			if tc.finish {
				e.finish(t, req.Key, kv.Completed, kv.Result{Status: 200, Body: []byte(`{}`)})
			}
			before, rev := e.get(t, req.Key)
			id := adm.JobID
			if tc.id != nil {
				id = tc.id(id)
			}

			got, err := e.core.Cancel(ctx, tc.tenant, id, cancelBody)
			if !errors.Is(err, tc.want) {
				t.Fatalf("cancel: %v, want %v", err, tc.want)
			}
			now, nrev := e.get(t, req.Key)
			if tc.want != nil || tc.finish {
				if nrev != rev || now.State != before.State {
					t.Fatalf("record moved from %s rev %d to %s rev %d", before.State, rev, now.State, nrev)
				}
				if tc.finish && (got.State != kv.Completed || got.Cancelled) {
					t.Fatalf("cancel answered %s cancelled=%v", got.State, got.Cancelled)
				}
				return
			}
			want := string(cancelBody("openai"))
			for _, rec := range []*kv.Record{got, now} {
				if rec.State != kv.Failed || !rec.Cancelled || rec.Result == nil ||
					rec.Result.Status != http.StatusConflict || string(rec.Result.Body) != want {
					t.Fatalf("record after cancel: %s cancelled=%v result %+v", rec.State, rec.Cancelled, rec.Result)
				}
			}
			if c := next(t, adm); c.Kind != intent.Error || c.Status() != http.StatusConflict || string(c.Payload()) != want {
				t.Fatalf("follower read %s %d %q, want the cancellation error", c.Kind, c.Status(), c.Payload())
			}
			if err := pub.Publish(ctx, jobs.KindData, 0, []byte("late")); !errors.Is(err, jobs.ErrFenced) {
				t.Fatalf("the cancelled job's worker published: %v, want ErrFenced", err)
			}
		})
	}
}
