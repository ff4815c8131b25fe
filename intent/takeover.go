package intent

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TakeOver moves a PENDING record whose lease expired to a new epoch by compare-and-set (only
// one taker wins; the loser gets kv.ErrConflict), then fences the old epoch's chunk subject so
// its owner can write nothing more and its followers see the restart. The returned job is not
// published; the caller runs it or submits it.
func TakeOver(ctx context.Context, js jetstream.JetStream, store *kv.Store, key string, rec *kv.Record, rev uint64, now time.Time, lease time.Duration) (*jobs.Job, *kv.Record, uint64, error) {
	old := rec.Epoch
	next := *rec
	next.Epoch = old + 1
	next.EpochStarted = now
	next.LeaseUntil = now.Add(lease)
	// The vanished owner's attempts are counted, never hidden, and charged with the record's
	// outcome (estimated): the backend may have run and billed them. Its progress says what it
	// sent; without progress (a restart of the memory stream), a record a renewal marked
	// dispatched certainly reached the backend; any other may or may not have (Takeovers).
	next.Takeovers++
	next.Unfinished = slices.Clone(rec.Unfinished)
	p, err := store.Progress(ctx, key, old)
	if err != nil || p.JobID != rec.JobID || p.Epoch != old {
		p = nil
	}
	if p == nil && (rec.Progress == kv.ProgressDispatched || rec.Progress == kv.ProgressStreaming) {
		p = &kv.Progress{JobID: rec.JobID, Epoch: old, Attempt: 1, Backend: rec.Backend, Tokens: rec.Tokens}
	}
	next.AddUnfinished(p, false)
	next.Worker = ""
	next.Progress = kv.ProgressQueued
	next.Chunks = 0
	nrev, err := store.Update(ctx, key, &next, rev)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("intent: take over %s epoch %d: %w", key, old, err)
	}
	if err := jobs.Fence(ctx, js, key, old); err != nil {
		return nil, nil, 0, err
	}
	job, err := Job(key, &next, nrev)
	if err != nil {
		return nil, nil, 0, err
	}
	return job, &next, nrev, nil
}

// Job is the submittable job of the current epoch of rec, stored at revision rev: the view of
// JobOf plus the record's stored bytes.
func Job(key string, rec *kv.Record, rev uint64) (*jobs.Job, error) {
	data, err := kv.Encode(rec)
	if err != nil {
		return nil, fmt.Errorf("intent: job of %s: %w", key, err)
	}
	return JobEncoded(key, rec, rev, data), nil
}

// JobEncoded is Job for a record already encoded as data.
func JobEncoded(key string, rec *kv.Record, rev uint64, data []byte) *jobs.Job {
	j := JobOf(key, rec)
	j.Rev, j.Record = rev, data
	return j
}

// JobOf is the worker's view of the job that executes the current epoch of rec (what a job
// message carries, decoded).
func JobOf(key string, rec *kv.Record) *jobs.Job {
	j := &jobs.Job{ID: rec.JobID, Key: key, Epoch: rec.Epoch, Tenant: rec.Tenant, Backends: rec.Backends,
		Model: rec.Model, Stream: rec.Stream, API: rec.API, Body: rec.Request, Header: rec.Header, Deadline: rec.Deadline}
	if d := rec.Degraded; d != nil {
		j.DegradedMessage, j.DegradedRetryAfter = d.Message, d.RetryAfter
		if j.DegradedMessage == "" && j.DegradedRetryAfter == 0 {
			j.DegradedRetryAfter = 1
		}
	}
	return j
}
