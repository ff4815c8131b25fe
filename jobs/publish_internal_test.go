package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// TestFinalChunkExpires: with a final TTL, a terminal chunk that is its subject's only chunk
// (a non-stream answer) carries the TTL and leaves the stream by itself, so it needs no purge;
// after data chunks it carries the TTL too, but the subject still needs its purge (the data
// chunks stay), and ExpiresAlone says so. Without a TTL nothing expires.
func TestFinalChunkExpires(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := EnsureStreams(ctx, srv.JS, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	st, err := srv.JS.Stream(ctx, ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	held := func(subject string) uint64 {
		t.Helper()
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subject]
	}
	tests := []struct {
		name      string
		ttl       time.Duration
		data      int
		wantAlone bool
		wantLeft  uint64 // chunks on the subject once the TTL has passed
	}{
		{"answer alone", 300 * time.Millisecond, 0, true, 0}, // rounded up to 1 s
		{"after data", time.Second, 2, false, 2},
		{"no ttl", 0, 0, false, 1},
	}
	pubs := make([]*Publisher, len(tests))
	for i, tt := range tests {
		pub := NewPublisher(srv.JS, &Job{ID: NewID(), Key: "final-ttl-" + strconv.Itoa(i), Epoch: 1})
		pub.SetFinalTTL(tt.ttl)
		for range tt.data {
			if err := pub.Publish(ctx, KindData, 0, []byte("d")); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Publish(ctx, KindResult, 200, []byte(`{"ok":true}`)); err != nil {
			t.Fatal(err)
		}
		if got := pub.ExpiresAlone(); got != tt.wantAlone {
			t.Errorf("%s: ExpiresAlone = %t, want %t", tt.name, got, tt.wantAlone)
		}
		m, err := st.GetLastMsgForSubject(ctx, pub.subject)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := m.Header.Get(jetstream.MsgTTLHeader) != "", tt.ttl > 0; got != want {
			t.Errorf("%s: terminal chunk has a TTL header: %t, want %t (%q)", tt.name, got, want, m.Header.Get(jetstream.MsgTTLHeader))
		}
		pubs[i] = pub
	}
	for i, tt := range tests {
		testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			if n := held(pubs[i].subject); n != tt.wantLeft {
				return fmt.Errorf("%s: %d chunks on the subject, want %d once the TTL passed", tt.name, n, tt.wantLeft)
			}
			return nil
		})
	}
	time.Sleep(1500 * time.Millisecond) // past every TTL: what should stay has stayed
	for i, tt := range tests {
		if n := held(pubs[i].subject); n != tt.wantLeft {
			t.Errorf("%s: %d chunks on the subject after the TTL, want %d", tt.name, n, tt.wantLeft)
		}
	}
}
