package jobs_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// TestSubmitRetriesUntilJOBSIsBack: a job submitted while JOBS is gone (a NATS restart lost the
// memory stream, and it is being recreated) is retried, with its one message id, until the
// stream is back; it is then queued once, and a re-submission inside the duplicate window is
// dropped.
func TestSubmitRetriesUntilJOBSIsBack(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.JS.DeleteStream(ctx, jobs.JobsStream); err != nil {
		t.Fatal(err)
	}
	job := &jobs.Job{ID: jobs.NewID(), Key: "k", Epoch: 1, Rev: 1, Record: []byte(`{"state":"PENDING"}`)}
	// Every try is a plain message on the job's subject; this subscriber sees each one (and,
	// never answering, makes each one wait for its deadline: no "no responders", which nats.go
	// retries itself). A second message is Submit trying again.
	nc, _ := srv.Conn(t)
	tries := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe("jobs.run.k", tries); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	submitted := make(chan error, 1)
	go func() { submitted <- jobs.Submit(ctx, srv.JS, job) }()
	for range 2 {
		testkit.RequireChanRead(t, tries, 10*time.Second)
	}
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := testkit.RequireChanRead(t, submitted, 15*time.Second); err != nil {
		t.Fatalf("submit: %v, want it queued once JOBS is back", err)
	}
	if err := jobs.Submit(ctx, srv.JS, job); err != nil {
		t.Fatal(err)
	}
	st, err := srv.JS.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("JOBS holds %d messages, want the job once", n)
	}
}

// TestJobWire: a job travels as its record, or, when it carries a request its record stores
// out, as that request with the record in a header; either way a worker decodes what was
// submitted. A record with a line break cannot be a header and is refused before anything is
// sent.
func TestJobWire(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name            string
		record, request string
		refused         bool
	}{
		{name: "record only", record: `{"state":"PENDING"}` + "\n" + `{"model":"m"}`},
		{name: "request beside the record", record: `{"state":"PENDING","request_at":1}`, request: `{"model":"m","messages":[]}`},
		{name: "record with a line break beside a request", record: "{\n}", request: `{}`, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "wire" + strconv.Itoa(i)
			job := &jobs.Job{ID: jobs.NewID(), Key: key, Epoch: 1, Rev: 7, Record: []byte(tc.record)}
			if tc.request != "" {
				job.Request = []byte(tc.request)
			}
			err := jobs.Submit(ctx, srv.JS, job)
			if tc.refused {
				if !errors.Is(err, jobs.ErrInvalidJob) {
					t.Fatalf("submit: %v, want ErrInvalidJob", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			st, err := srv.JS.Stream(ctx, jobs.JobsStream)
			if err != nil {
				t.Fatal(err)
			}
			m, err := st.GetLastMsgForSubject(ctx, jobs.JobsSubjects[:len(jobs.JobsSubjects)-1]+key)
			if err != nil {
				t.Fatal(err)
			}
			got, err := jobs.Decode(m.Header, m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Record) != tc.record || string(got.Request) != tc.request || got.ID != job.ID || got.Rev != 7 {
				t.Fatalf("decoded record %q request %q id %s rev %d, want %q %q %s 7", got.Record, got.Request, got.ID, got.Rev, tc.record, tc.request, job.ID)
			}
		})
	}
}
