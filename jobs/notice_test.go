package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// chunksStored is how many chunks CHUNKS holds on subject.
func chunksStored(t *testing.T, srv *testkit.JetStream, subject string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := srv.JS.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// TestNoticeOutcome: with notices, a non-stream execution's outcome reaches the follower that
// opened it and a follower that joined it, and nothing is stored on its chunk subject; a
// takeover's fence, stored, reaches both as a notice too.
func TestNoticeOutcome(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	hub := jobs.NewHub(srv.NC, srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true, Notices: true})
	t.Cleanup(hub.Close)
	other := jobs.NewHub(srv.NC, srv.JS, zerolog.Nop(), jobs.HubOptions{}) // another API node's, in a cluster
	t.Cleanup(other.Close)
	if !hub.Notices() || other.Notices() {
		t.Fatalf("Notices() = %v, %v; want true, false", hub.Notices(), other.Notices())
	}

	t.Run("outcome", func(t *testing.T) {
		job := newJob("notice-outcome")
		opened, err := hub.OpenNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer opened.Close()
		joined, err := other.JoinNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer joined.Close()
		pub := jobs.NewPublisher(srv.JS, job)
		pub.SetNotice()
		pub.SetMeta(jobs.Meta{Backend: "b1", Attempts: 1})
		if err := pub.Publish(ctx, jobs.KindResult, http.StatusOK, []byte(`{"answer":1}`)); err != nil {
			t.Fatal(err)
		}
		for name, fl := range map[string]*jobs.Follower{"opened": opened, "joined": joined} {
			got := readAll(t, fl)
			if len(got) != 1 || got[0].Kind != jobs.KindResult || got[0].Status != http.StatusOK ||
				string(got[0].Payload) != `{"answer":1}` || got[0].Meta.Backend != "b1" {
				t.Fatalf("%s follower got %+v, want the one result", name, got)
			}
		}
		if n := chunksStored(t, srv, job.Subject()); n != 0 {
			t.Fatalf("%d chunks stored for a notice, want none", n)
		}
		if !pub.ExpiresAlone() {
			t.Fatal("ExpiresAlone() = false after a notice: the subject would be purged for nothing")
		}
	})

	t.Run("fence", func(t *testing.T) {
		job := newJob("notice-fence")
		opened, err := hub.OpenNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer opened.Close()
		if err := jobs.Fence(ctx, srv.JS, job.Key, job.ID, job.Epoch); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, opened); len(got) != 1 || got[0].Kind != jobs.KindFence {
			t.Fatalf("opened follower got %+v, want the fence", got)
		}
		// A joiner after the fence finds it in the history.
		joined, err := other.JoinNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer joined.Close()
		if got := readAll(t, joined); len(got) != 1 || got[0].Kind != jobs.KindFence {
			t.Fatalf("joined follower got %+v, want the fence", got)
		}
	})

	t.Run("without notices it is Open", func(t *testing.T) {
		job := newJob("notice-off")
		fl, err := other.OpenNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		pub := jobs.NewPublisher(srv.JS, job) // a job without Notice: stored as ever
		if err := pub.Publish(ctx, jobs.KindResult, http.StatusOK, []byte(`{"answer":2}`)); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, fl); len(got) != 1 || string(got[0].Payload) != `{"answer":2}` {
			t.Fatalf("follower got %+v, want the stored result", got)
		}
		if n := chunksStored(t, srv, job.Subject()); n != 1 {
			t.Fatalf("%d chunks stored, want the terminal one", n)
		}
	})
}

// TestJobNoticeOnTheWire: Job.Notice survives Submit and Decode.
func TestJobNoticeOnTheWire(t *testing.T) {
	for _, notice := range []bool{false, true} {
		srv := testkit.RunJetStream(t, time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
			t.Fatal(err)
		}
		job := &jobs.Job{ID: jobs.NewID(), Key: "wire", Epoch: 1, Rev: 1, Record: []byte(`{}`), Notice: notice}
		if err := jobs.Submit(ctx, srv.JS, job); err != nil {
			t.Fatal(err)
		}
		st, err := srv.JS.Stream(ctx, jobs.JobsStream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, "jobs.run.wire")
		if err != nil {
			t.Fatal(err)
		}
		got, err := jobs.Decode(m.Header, m.Data)
		cancel()
		if err != nil || got.Notice != notice {
			t.Fatalf("decoded %+v %v, want Notice %v", got, err, notice)
		}
	}
}

// TestEndStored: a joiner that found the outcome in the record after it joined ends its feed
// with ErrStored (an ErrEnded), as a KindStored chunk would end it.
func TestEndStored(t *testing.T) {
	_, hub := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	job := newJob("end-stored")
	fl, err := hub.JoinNonStream(ctx, job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	fl.EndStored()
	if _, err := fl.Next(ctx); !errors.Is(err, jobs.ErrStored) || !errors.Is(err, jobs.ErrEnded) {
		t.Fatalf("Next after EndStored: %v, want ErrStored", err)
	}
}

// TestNoticesOnACluster: on a cluster a follower's interest crosses the routes
// asynchronously, so a notice published on another server just after the follower subscribed
// can find nobody there. Each execution here is opened on server 0 and its outcome published
// at once on server 1, as tight as the race gets (a gateway has a record and a job written in
// between): every outcome must reach its follower, as a notice answered or as the terminal
// chunk stored when nobody answered, which the hub's tail reads. With the notice published
// unanswered and never stored, followers whose notice went first waited for ever.
func TestNoticesOnACluster(t *testing.T) {
	ctx, nc, js, worker := chunksCluster(t)
	hub := jobs.NewHub(nc, js, zerolog.Nop(), jobs.HubOptions{Notices: true})
	t.Cleanup(hub.Close)
	const n = 100
	stored := 0
	for i := range n {
		job := newJob(fmt.Sprintf("cluster-notice-%d", i))
		fl, err := hub.OpenNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		pub := jobs.NewPublisher(worker, job)
		pub.SetNotice()
		body := fmt.Sprintf(`{"n":%d}`, i)
		if err := pub.Publish(ctx, jobs.KindResult, http.StatusOK, []byte(body)); err != nil {
			t.Fatal(err)
		}
		if !pub.ExpiresAlone() { // a heard notice leaves nothing; a stored chunk (no TTL here) stays
			stored++
		}
		wait, stop := context.WithTimeout(ctx, 10*time.Second)
		ch, err := fl.Next(wait)
		stop()
		if err != nil || string(ch.Payload) != body {
			t.Fatalf("execution %d: %q, %v; want its outcome %s", i, ch.Payload, err, body)
		}
		fl.Close()
	}
	t.Logf("%d of %d outcomes heard as notices, %d stored as terminal chunks", n-stored, n, stored)
}

// chunksCluster starts a three-server cluster with the jobs streams on three replicas and
// returns a context for the test (60 s), an API side's connection to server 0 and a worker's
// JetStream on server 1: a worker's chunk crosses the routes to the API side's tail.
func chunksCluster(t *testing.T) (context.Context, *nats.Conn, jetstream.JetStream, jetstream.JetStream) {
	t.Helper()
	c := testkit.RunCluster(t, 3)
	nc, js := c.ConnectTo(t, 0)
	_, worker := c.ConnectTo(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := jobs.EnsureStreams(ctx, js, jobs.StreamConfig{MaxChunkBytes: 64 << 20, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	return ctx, nc, js, worker
}

// TestHeldNoticesOnACluster (issue 44): a held job's follower, opened on a cluster with
// OpenHeld, makes no subscription (whose interest would cross the routes and back per intent):
// its outcome comes in process from the publisher (SetLocal), and is published as well for a
// copy followed on another node; a fence sent from another node reaches it through the tail;
// with its follower gone, the outcome is sent as a request and, unanswered, stored.
func TestHeldNoticesOnACluster(t *testing.T) {
	ctx, nc, js, worker := chunksCluster(t)
	hub := jobs.NewHub(nc, js, zerolog.Nop(), jobs.HubOptions{Notices: true})
	t.Cleanup(hub.Close)
	other := jobs.NewHub(worker.Conn(), worker, zerolog.Nop(), jobs.HubOptions{Notices: true}) // another node's
	t.Cleanup(other.Close)
	open := func(key string) (*jobs.Job, *jobs.Follower) {
		t.Helper()
		job := newJob(key)
		fl, err := hub.OpenHeld(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fl.Close)
		return job, fl
	}
	next := func(fl *jobs.Follower) jobs.Chunk {
		t.Helper()
		wait, stop := context.WithTimeout(ctx, 10*time.Second)
		defer stop()
		c, err := fl.Next(wait)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	open("held-notice-tail") // starts the tail, the hub's one subscription on a cluster
	subs := nc.NumSubscriptions()

	t.Run("outcome in process, and to a copy elsewhere", func(t *testing.T) {
		job, fl := open("held-notice-outcome")
		joined, err := other.JoinNonStream(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer joined.Close()
		if got := nc.NumSubscriptions(); got != subs {
			t.Fatalf("a held follower made %d subscriptions; want none", got-subs)
		}
		pub := jobs.NewPublisher(worker, job)
		pub.SetNotice()
		pub.SetLocal(hub)
		if err := pub.Publish(ctx, jobs.KindResult, http.StatusOK, []byte(`{"held":1}`)); err != nil {
			t.Fatal(err)
		}
		if !pub.ExpiresAlone() {
			t.Fatal("the outcome was stored; want it taken in process")
		}
		for name, f := range map[string]*jobs.Follower{"held": fl, "joined elsewhere": joined} {
			if c := next(f); c.Kind != jobs.KindResult || string(c.Payload) != `{"held":1}` {
				t.Fatalf("%s follower: %s %q; want the outcome", name, c.Kind, c.Payload)
			}
		}
		if n := chunksStored(t, &testkit.JetStream{JS: js}, job.Subject()); n != 0 {
			t.Fatalf("%d chunks stored; want none", n)
		}
	})

	t.Run("fence from another node", func(t *testing.T) {
		job, fl := open("held-notice-fence")
		if err := jobs.Fence(ctx, worker, job.Key, job.ID, job.Epoch); err != nil {
			t.Fatal(err)
		}
		if c := next(fl); c.Kind != jobs.KindFence {
			t.Fatalf("held follower: %s; want the fence", c.Kind)
		}
	})

	t.Run("follower gone", func(t *testing.T) {
		job, fl := open("held-notice-gone")
		fl.Close()
		pub := jobs.NewPublisher(worker, job)
		pub.SetNotice()
		pub.SetLocal(hub)
		if err := pub.Publish(ctx, jobs.KindResult, http.StatusOK, []byte(`{"held":2}`)); err != nil {
			t.Fatal(err)
		}
		if n := chunksStored(t, &testkit.JetStream{JS: js}, job.Subject()); n != 1 {
			t.Fatalf("%d chunks stored; want the unheard outcome stored", n)
		}
	})
}
