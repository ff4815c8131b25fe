package jobs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// TestDiscarderRemovesOnlyScheduledSubjects: a scheduled execution's chunks leave CHUNKS after
// the grace; another execution's chunks stay, and a follower that joins later finds no history.
func TestDiscarderRemovesOnlyScheduledSubjects(t *testing.T) {
	srv, hub := setup(t)
	ctx := context.Background()
	finished, running := newJob("discard-finished"), newJob("discard-running")
	for _, job := range []*jobs.Job{finished, running} {
		pub := jobs.NewPublisher(srv.JS, job)
		for i := 0; i < 3; i++ {
			if err := pub.Publish(ctx, jobs.KindData, 0, []byte("p")); err != nil {
				t.Fatal(err)
			}
		}
		if job == finished {
			if err := pub.Publish(ctx, jobs.KindDone, 200, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	d := jobs.NewDiscarder(srv.JS, 50*time.Millisecond, zerolog.Nop())
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d.Run(runCtx) }()
	defer func() { stop(); wg.Wait() }()

	d.Schedule(finished.Subject())
	stream, err := srv.JS.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := stream.GetLastMsgForSubject(ctx, finished.Subject())
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil
		case err != nil:
			return err
		}
		return errors.New("the finished execution's chunks were not discarded")
	})
	if d.Pending() != 0 {
		t.Fatalf("%d discards still pending", d.Pending())
	}
	if m, err := stream.GetLastMsgForSubject(ctx, running.Subject()); err != nil || m == nil {
		t.Fatalf("the unscheduled execution lost its chunks: %v", err)
	}
	fl, err := hub.Join(ctx, running.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if c, err := fl.Next(jctx); err != nil || c.Idx != i {
			t.Fatalf("running execution chunk %d: %+v %v", i, c, err)
		}
	}
}
