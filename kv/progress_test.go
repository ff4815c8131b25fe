package kv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

// TestProgressOfAnEpochSurvivesTheOldOwner: after a takeover, the worker that lost the record
// can still publish its (old) epoch's progress until its next renewal notices. That write must
// not replace the new epoch's progress, or a running execution would read as queued (its
// record's epoch no longer matches the last progress) until the new owner's next refresh.
func TestProgressOfAnEpochSurvivesTheOldOwner(t *testing.T) {
	st, _ := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const key = "progress-takeover"
	newOwner := &kv.Progress{JobID: "J", Epoch: 2, Attempt: 1, Backend: "b2", Sent: time.Now().UTC()}
	if err := st.PutProgress(key, newOwner); err != nil {
		t.Fatal(err)
	}
	// The old owner, not yet fenced, reports more tokens of epoch 1, after the new owner's write.
	if err := st.PutProgress(key, &kv.Progress{JobID: "J", Epoch: 1, Attempt: 1, Backend: "b1", Tokens: 40}); err != nil {
		t.Fatal(err)
	}
	// The writes are asynchronous: poll until the old owner's landed.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		old, err := st.Progress(ctx, "J", 1)
		if err != nil {
			return fmt.Errorf("the old owner's progress never landed: %w", err)
		}
		if old.Tokens != 40 {
			return fmt.Errorf("the old owner's progress has %d tokens, want 40", old.Tokens)
		}
		return nil
	})
	got, err := st.Progress(ctx, "J", 2)
	if err != nil {
		t.Fatalf("epoch 2's progress after the old owner wrote epoch 1's: %v", err)
	}
	if got.Epoch != 2 || got.Backend != "b2" || got.Attempt != 1 {
		t.Fatalf("epoch 2's progress = %+v, want the new owner's", got)
	}
	if _, err := st.Progress(ctx, "J", 3); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("progress of an epoch nobody wrote: %v, want ErrNotFound", err)
	}
}

// TestProgressMovesToFileStorage: PROGRESS as an older version made it (a memory stream) is
// made again on file storage when the store opens, in async persist mode on one replica, so a
// restart of its server keeps the account of the attempts sent (issue 34). Opening again
// changes nothing.
func TestProgressMovesToFileStorage(t *testing.T) {
	s := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: kv.ProgressStream, Subjects: []string{"progress.>"},
		Storage: jetstream.MemoryStorage, MaxMsgsPerSubject: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := kv.Open(ctx, s.JS, kv.BucketConfig{TTL: time.Hour}); err != nil {
			t.Fatalf("open %d: %v", i+1, err)
		}
		st, err := s.JS.Stream(ctx, kv.ProgressStream)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.CachedInfo().Config; c.Storage != jetstream.FileStorage || c.PersistMode != jetstream.AsyncPersistMode {
			t.Fatalf("after open %d: PROGRESS storage %s, persist mode %s; want file, async", i+1, c.Storage, c.PersistMode)
		}
	}
}
