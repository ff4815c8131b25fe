package intent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TakeOver moves a PENDING record whose lease expired to a new epoch by compare-and-set (only
// one taker wins; the loser gets kv.ErrConflict), then fences the old epoch's chunk subject so
// its owner can write nothing more and its followers see the restart. The returned job is not
// published; the caller runs it or submits it. The new lease starts at now() read just before
// the write: the reads before it (the owner probe a caller made, the progress, a stored
// request) can take seconds in a partition, and a lease dated before them could be run out
// already when it lands (in row 3b another node's sweep took over such an epoch while it ran).
//
// A record whose request is stored in REQUESTS gets it read first; when it is gone
// (kv.ErrRequestLost: its claim's node died before storing it, so no job ever ran, or it
// outlived the stream), the record is failed instead, and the error says so.
func TakeOver(ctx context.Context, js jetstream.JetStream, store *kv.Store, key string, rec *kv.Record, rev uint64, now func() time.Time, lease time.Duration) (*jobs.Job, *kv.Record, uint64, error) {
	old := rec.Epoch
	// The vanished owner's progress says what it sent; TakenOver counts it (nil: none read).
	p, err := store.Progress(ctx, rec.JobID, old)
	if err != nil {
		p = nil
	}
	lost := false
	if rec.RequestAt > 0 && len(rec.Request) == 0 {
		body, err := store.Request(ctx, key, rec)
		switch {
		case errors.Is(err, kv.ErrRequestLost):
			lost = true
		case err != nil:
			return nil, nil, 0, fmt.Errorf("intent: take over %s epoch %d: %w", key, old, err)
		default:
			rec = rec.WithRequest(body)
		}
	}
	at := now()
	next := rec.TakenOver(at, lease, p)
	if lost {
		next = requestLost(rec, next, at)
	}
	nrev, err := store.Update(ctx, key, next, rev)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("intent: take over %s epoch %d: %w", key, old, err)
	}
	if err := jobs.Fence(ctx, js, key, rec.JobID, old); err != nil {
		return nil, nil, 0, err
	}
	if lost {
		return nil, nil, 0, fmt.Errorf("intent: take over %s epoch %d: %w (failed it)", key, old, kv.ErrRequestLost)
	}
	job, err := Job(key, next, nrev)
	if err != nil {
		return nil, nil, 0, err
	}
	return job, next, nrev, nil
}

// FailLostRequest fails epoch rec.Epoch of key, which a worker was about to run from its job
// when the request the record stores in REQUESTS was gone (kv.ErrRequestLost), as a takeover
// fails one (requestLost), then fences the epoch so that its followers read the record.
func FailLostRequest(ctx context.Context, js jetstream.JetStream, store *kv.Store, key string, rec *kv.Record, rev uint64, now time.Time) error {
	if _, err := store.Update(ctx, key, requestLost(rec, rec, now), rev); err != nil {
		return fmt.Errorf("intent: fail %s epoch %d: %w", key, rec.Epoch, err)
	}
	return jobs.Fence(ctx, js, key, rec.JobID, rec.Epoch)
}

// requestLost is next, the takeover of rec, failed because rec's stored request is gone: a
// 503 the client may retry (a new epoch) only when no attempt of rec can have been sent, so a
// retry never runs an intent twice.
func requestLost(rec, next *kv.Record, now time.Time) *kv.Record {
	sent := next.Attempts > 0 || len(next.Unfinished) > 0 || rec.Takeovers > 0 || rec.Progress != kv.ProgressQueued
	return next.Failed(now, &kv.Result{Status: http.StatusServiceUnavailable, Retryable: !sent}, kv.Execution{})
}

// ReleaseRefused releases key's record rec, read at rev, when it is an admission the store
// took only after its API had refused the request (kv.Store.AdmittedLate): that client was
// answered 503 "nothing was executed", so the claim is given back (FAILED, retryable, as
// Released) instead of being re-driven, and a copy sent later claims the key anew. released
// says it did; a record that is not such a claim is left as it is.
func ReleaseRefused(ctx context.Context, store *kv.Store, key string, rec *kv.Record, rev uint64) (released bool, err error) {
	late, err := store.AdmittedLate(ctx, key, rec, rev)
	if err != nil || !late {
		return false, err
	}
	if err := releaseRefused(ctx, store, key, rec, rev); err != nil {
		return false, err
	}
	return true, nil
}

// releaseRefused gives back rec, a refused admission's write read at rev (PENDING → FAILED,
// retryable: Released). Its job was never launched, so no request was stored for it in
// REQUESTS (launch stores one) and nothing else is to be undone.
func releaseRefused(ctx context.Context, store *kv.Store, key string, rec *kv.Record, rev uint64) error {
	if _, err := store.Update(ctx, key, rec.Released(), rev); err != nil {
		return fmt.Errorf("intent: release the refused claim of %s: %w", key, err)
	}
	return nil
}

// Abandoned reports whether the execution of key that rec names may be taken over: its lease
// ran out while the records' bucket was steady for a lease (kv.Store.Abandoned), and no
// worker answers that it still runs that epoch (jobs.Running: an owner that can be reached
// is alive, whatever its renewals did). When it may, unheard says why the owner was not
// heard, for the taker's log.
func Abandoned(ctx context.Context, js jetstream.JetStream, store *kv.Store, key string, rec *kv.Record, now time.Time, lease time.Duration) (ok bool, unheard error) {
	if !store.Abandoned(ctx, rec, now, lease) {
		return false, nil
	}
	running, unheard := jobs.Running(ctx, js.Conn(), key, rec.Epoch)
	return !running, unheard
}

// LeaderRead adds to a takeover's log line the records' leader that store's lease check read
// and since when it leads (kv.Store.LeaderSeen): which side of a partition the decision saw.
func LeaderRead(store *kv.Store) func(*zerolog.Event) {
	return func(e *zerolog.Event) {
		leader, since := store.LeaderSeen()
		e.Str("leader", leader).Time("leader_since", since)
	}
}

// Job is the submittable job of the current epoch of rec, stored at revision rev: the view of
// JobOf plus the record's stored bytes; a request the record stores out stays in REQUESTS
// (Job.RequestStored), where the worker reads it.
func Job(key string, rec *kv.Record, rev uint64) (*jobs.Job, error) {
	data, err := kv.Encode(rec)
	if err != nil {
		return nil, fmt.Errorf("intent: job of %s: %w", key, err)
	}
	return JobEncoded(key, rec, rev, data), nil
}

// JobEncoded is Job for a record already encoded as data (kv.Encode).
func JobEncoded(key string, rec *kv.Record, rev uint64, data []byte) *jobs.Job {
	j := JobOf(key, rec)
	j.Rev, j.Record, j.RequestStored = rev, data, rec.RequestAt > 0
	return j
}

// JobOf is the worker's view of the job that executes the current epoch of rec (what a job
// message carries, decoded).
func JobOf(key string, rec *kv.Record) *jobs.Job {
	j := &jobs.Job{ID: rec.JobID, Key: key, Epoch: rec.Epoch, Tenant: rec.Tenant, Backends: rec.Backends,
		Model: rec.Model, Stream: rec.Stream, API: rec.API, Path: rec.Path, Body: rec.Request, Header: rec.Header, Deadline: rec.Deadline}
	if d := rec.Degraded; d != nil {
		j.DegradedMessage, j.DegradedRetryAfter = d.Message, d.RetryAfter
		if j.DegradedMessage == "" && j.DegradedRetryAfter == 0 {
			j.DegradedRetryAfter = 1
		}
	}
	return j
}
