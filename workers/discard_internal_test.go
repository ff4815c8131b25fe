package workers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestAnswerAloneExpiresUnpurged: a non-stream execution writes one chunk, its terminal one,
// with a TTL of the discard grace, and schedules no purge; a stream execution's terminal chunk
// follows data chunks, so its subject is still queued for the purge. Both answers are stored.
func TestAnswerAloneExpiresUnpurged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newCrashRig(t, ctx)
	opts := r.opts
	opts.DiscardChunksAfter = time.Minute // nothing is purged or expires during the test
	pool := New(r.srv.JS, r.store, opts)
	defer r.run(ctx, pool)()

	plain := r.submit(t, ctx, "alone-plain")
	streamed := r.submitStream(t, ctx, "alone-stream")
	for key, rec := range map[string]*kv.Record{"alone-plain": plain, "alone-stream": streamed} {
		if done := waitFinished(t, ctx, r.store, key, rec); done.State != kv.Completed {
			t.Fatalf("%s: %s, want COMPLETED", key, done.State)
		}
	}
	st, err := r.srv.JS.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	for key, rec := range map[string]*kv.Record{"alone-plain": plain, "alone-stream": streamed} {
		m, err := st.GetLastMsgForSubject(ctx, jobs.ChunkSubject(key, rec.JobID, rec.Epoch))
		if err != nil {
			t.Fatalf("%s: terminal chunk: %v", key, err)
		}
		if ttl := m.Header.Get(jetstream.MsgTTLHeader); ttl != "1m0s" {
			t.Errorf("%s: terminal chunk TTL %q, want 1m0s (the discard grace)", key, ttl)
		}
	}
	// Both jobs are acked after their discard step: once JOBS is empty, both have passed it.
	jobsStream, err := r.srv.JS.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		info, err := jobsStream.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("%d jobs not acked yet", info.State.Msgs)
		}
		return nil
	})
	if n := pool.discard.Pending(); n != 1 {
		t.Fatalf("%d subjects queued for a purge, want 1 (the stream's; the plain answer expires by itself)", n)
	}
}
