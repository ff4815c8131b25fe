package workers

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestLostFeedKeepsTheAnswer: CHUNKS is lost in the middle of a stream (the memory stream
// of a NATS cluster that lost power, recreated empty): the worker's next chunk can never be
// written. The answer is not lost with it: the worker reads the backend to the end, stores
// COMPLETED with every frame, and ends the epoch with a stored-outcome chunk (no further
// output chunk, so no follower sees a gap): a follower's feed ends with jobs.ErrStored. Before,
// the execution ended FAILED stream_interrupted although its backend had answered in full.
func TestLostFeedKeepsTheAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	r := newCrashRig(t, ctx)
	paced, err := backend.New(config.Backend{Name: "mock", Type: config.TypeMock, Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 12, InterToken: config.Duration(100 * time.Millisecond)},
		Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.opts.Backends = map[string]Backend{"mock": paced}
	hub := jobs.NewHub(r.srv.NC, r.srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
	defer hub.Close()
	defer r.run(ctx, New(r.srv.JS, r.store, r.opts))()

	// The control: the same request with nothing lost.
	control := r.submitStream(t, ctx, "feed-kept")
	want := waitFinished(t, ctx, r.store, "feed-kept", control)

	const key = "feed-lost"
	rec := r.submitStream(t, ctx, key)
	fl, err := hub.Join(ctx, jobs.ChunkSubject(key, rec.JobID, rec.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if ch, err := fl.Next(ctx); err != nil || ch.Kind != jobs.KindData {
		t.Fatalf("first chunk %+v, %v; want output", ch, err)
	}
	// The follower reads a chunk as it is published (a core subscription on one server), maybe
	// before CHUNKS stored it: the loss comes once the stream holds it. Lost with the first
	// publish still in flight, the worker's retry would store that chunk, which expects an
	// empty subject, in the recreated stream and the rest after it: nothing lost, nothing for
	// this test to see (a loaded machine did that).
	subject := jobs.ChunkSubject(key, rec.JobID, rec.Epoch)
	st, err := r.srv.JS.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return err
		}
		if info.State.Subjects[subject] == 0 {
			return errors.New("CHUNKS holds no chunk of the epoch yet")
		}
		return nil
	})
	if err := r.srv.JS.DeleteStream(ctx, jobs.ChunksStream); err != nil {
		t.Fatal(err)
	}
	testkit.Recreate(t, func() error { return jobs.EnsureStreams(ctx, r.srv.JS, jobs.StreamConfig{}) })

	got := waitFinished(t, ctx, r.store, key, rec)
	if got.State != kv.Completed || got.Result.Partial {
		t.Fatalf("record %s (partial %v), want COMPLETED: the backend answered in full", got.State, got.Result.Partial)
	}
	if g, w := content(t, got), content(t, want); g != w {
		t.Fatalf("stored answer %q, want the control's %q", g, w)
	}
	// The first follower's consumer resumes past the sequences of the recreated stream, so it
	// learns the outcome from the record (httpapi's idle check, intent.Admission.Next); one
	// that follows the epoch now is told by the stored-outcome chunk.
	fl.Close()
	late, err := hub.Join(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if ch, err := late.Next(ctx); !errors.Is(err, jobs.ErrStored) {
		t.Fatalf("a follower of the epoch after the loss: chunk %+v, %v; want jobs.ErrStored (no output chunk was written after the loss)", ch, err)
	}
}

// waitFinished waits until key's record of rec's epoch is finished.
func waitFinished(t *testing.T, ctx context.Context, store *kv.Store, key string, rec *kv.Record) *kv.Record {
	t.Helper()
	for {
		got, _, err := store.Get(ctx, key)
		if err == nil && got.State != kv.Pending && got.Epoch == rec.Epoch {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not finished: %+v %v", key, got, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// content is the assistant text of a finished stream record.
func content(t *testing.T, rec *kv.Record) string {
	t.Helper()
	body, err := openaiwire.Assemble(rec.Result.Events, rec.Result.UsageEvent)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) != 1 || out.Choices[0].Message.Content == "" {
		t.Fatalf("assembled %s: %v", body, err)
	}
	return out.Choices[0].Message.Content
}
