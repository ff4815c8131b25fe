package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestPublishRecognisesItsLandedChunk: a chunk publish whose answer was lost may have been
// stored. Its retry expects the old last sequence and is refused; the publisher then finds its
// own chunk (its index, its writer) at the head of the subject and goes on from there, once:
// the subject holds each chunk one time. Another writer's chunk at the head is a fence.
func TestPublishRecognisesItsLandedChunk(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := EnsureStreams(ctx, srv.JS, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	job := &Job{ID: NewID(), Key: "landed", Epoch: 1}
	pub := NewPublisher(srv.JS, job)
	if err := pub.Publish(ctx, KindData, 0, []byte("p0")); err != nil {
		t.Fatal(err)
	}
	// The try of chunk 1 that was stored although its answer never came.
	lost := Chunk{Idx: 1, Kind: KindData, Payload: []byte("p1")}.msg(pub.subject)
	lost.Header.Set(hdrWriter, pub.writer)
	if _, err := srv.JS.PublishMsg(ctx, lost); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, KindData, 0, []byte("p1")); err != nil {
		t.Fatalf("retry of a chunk that had landed: %v, want it recognised", err)
	}
	if err := pub.Publish(ctx, KindDone, 0, nil); err != nil {
		t.Fatalf("the chunk after it: %v", err)
	}
	st, err := srv.JS.Stream(ctx, ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(pub.subject))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[pub.subject]; n != 3 || pub.Next() != 3 {
		t.Fatalf("the subject holds %d chunks, publisher at %d; want 3 and 3 (p0, p1 once, done)", n, pub.Next())
	}

	// A second owner of the same epoch writing chunk 0 finds the first owner's chunk 0 at the
	// head: the same index, not its own writer, so it is fenced.
	other := &Job{ID: NewID(), Key: "two-owners", Epoch: 1}
	if err := NewPublisher(srv.JS, other).Publish(ctx, KindData, 0, []byte("a0")); err != nil {
		t.Fatal(err)
	}
	if err := NewPublisher(srv.JS, other).Publish(ctx, KindData, 0, []byte("b0")); !errors.Is(err, ErrFenced) {
		t.Fatalf("second owner's chunk 0: %v, want ErrFenced", err)
	}
}
