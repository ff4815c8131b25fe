package jobs_test

import (
	"context"
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
