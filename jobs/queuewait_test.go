package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// TestQueueWatchReadsTheHeadsWait: the watch reads no queue before any worker consumer
// exists and an empty one as 0; with jobs waiting, the wait of the oldest job not handed to a
// worker (growing while it waits) and their count; once a worker took the head, the next
// job's wait.
func TestQueueWatchReadsTheHeadsWait(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	q := jobs.NewQueueWatch(srv.JS, 0, "workers", time.Second, zerolog.Nop())
	read := func() (time.Duration, uint64) {
		t.Helper()
		w, n, err := q.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return w, n
	}
	if w, n := read(); w != 0 || n != 0 {
		t.Fatalf("without a consumer: wait %s, %d pending; want 0, 0", w, n)
	}
	cons, err := srv.JS.CreateOrUpdateConsumer(ctx, jobs.JobsStream, jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: jobs.JobsSubjects})
	if err != nil {
		t.Fatal(err)
	}
	if w, n := read(); w != 0 || n != 0 {
		t.Fatalf("empty queue: wait %s, %d pending; want 0, 0", w, n)
	}
	published := time.Now()
	for _, k := range []string{"k1", "k2"} {
		if _, err := srv.JS.Publish(ctx, "jobs.run."+k, []byte(k)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w1, n := read()
	if n != 2 || w1 <= 0 {
		t.Fatalf("two jobs queued: wait %s, %d pending", w1, n)
	}
	time.Sleep(20 * time.Millisecond)
	w2, _ := read()
	if w2 <= w1 || w2 > time.Since(published)+time.Second {
		t.Fatalf("the head's wait went from %s to %s while it waited %s", w1, w2, time.Since(published))
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data()) != "k1" {
		t.Fatalf("the worker got %q first", msg.Data())
	}
	w3, n := read()
	if n != 1 || w3 <= 0 || w3 >= time.Since(published) {
		t.Fatalf("after the head was taken: wait %s, %d pending; want the younger job's (under the %s since the first), 1",
			w3, n, time.Since(published))
	}
}
