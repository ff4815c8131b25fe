package jobs_test

import (
	"context"
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

// TestJobWire: a job travels as its record, with its version saying whether the record stores
// its request in REQUESTS (the worker then reads it there; a worker older than that version
// refuses it instead of running an empty request); a version-3 job an older node queued, its
// request as the body and its record in a header, still decodes. Either way a worker decodes
// what was submitted.
func TestJobWire(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	st, err := srv.JS.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name    string
		record  string
		stored  bool
		v3      string // a version-3 message's request (published by hand: nothing sends one now)
		version string // Og-Job-V on the wire
	}{
		{name: "record only", record: `{"state":"PENDING"}` + "\n" + `{"model":"m"}`, version: "2"},
		{name: "request stored out", record: `{"state":"PENDING","request_at":1}`, stored: true, version: "4"},
		{name: "an older node's version 3", record: `{"state":"PENDING","request_at":1}`, v3: `{"model":"m","messages":[]}`, version: "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "wire" + strconv.Itoa(i)
			job := &jobs.Job{ID: jobs.NewID(), Key: key, Epoch: 1, Rev: 7, Record: []byte(tc.record), RequestStored: tc.stored}
			if tc.v3 == "" {
				if err := jobs.Submit(ctx, srv.JS, job); err != nil {
					t.Fatal(err)
				}
			} else {
				m := nats.NewMsg(jobs.JobsSubjects[:len(jobs.JobsSubjects)-1] + key)
				for name, val := range map[string]string{"Og-Job-V": "3", "Og-Job-Id": job.ID, "Og-Key": key, "Og-Epoch": "1", "Og-Rev": "7", "Og-Record": tc.record} {
					m.Header.Set(name, val)
				}
				m.Data = []byte(tc.v3)
				if _, err := srv.JS.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			m, err := st.GetLastMsgForSubject(ctx, jobs.JobsSubjects[:len(jobs.JobsSubjects)-1]+key)
			if err != nil {
				t.Fatal(err)
			}
			if v := m.Header.Get("Og-Job-V"); v != tc.version {
				t.Fatalf("version %q on the wire, want %q", v, tc.version)
			}
			if tc.v3 == "" && string(m.Data) != tc.record {
				t.Fatalf("message body %q, want the record alone %q", m.Data, tc.record)
			}
			got, err := jobs.Decode(m.Header, m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Record) != tc.record || string(got.Request) != tc.v3 || got.RequestStored != tc.stored || got.ID != job.ID || got.Rev != 7 {
				t.Fatalf("decoded record %q request %q stored %v id %s rev %d, want %q %q %v %s 7",
					got.Record, got.Request, got.RequestStored, got.ID, got.Rev, tc.record, tc.v3, tc.stored, job.ID)
			}
		})
	}
}
