package kv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jspub"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/replicas"
)

// RequestsStream holds the requests too large to ride in their record (above
// BucketConfig.InlineRequestMax), one message per record key and claiming epoch on
// requests.<key>.<epoch>, written once after the claim and deleted once the record finishes.
//
// A record that carries its request pays for it on every write and every read: each lease
// renewal rewrites it, every reader (the worker, the API node's checks, a takeover) downloads
// it, and the server reads it back from disk for each. With 48 concurrent 4 MiB requests that
// was ~14 body-sized reads a request and a peak of 8-12× the bodies in the gateway's memory.
// A record that names its request instead stays a few hundred bytes; so does its job message
// (jobs.Job.RequestStored): the worker reads the request from here, so a large request is
// stored once in NATS, not also in JOBS (a memory stream, holding it until the job's ack).
//
// It is a file stream with the bucket's replicas: a re-drive after a crash needs it as much
// as the record. The subject carries the epoch of the claim that wrote it (a reclaim writes a
// new one), so deleting a finished epoch's request can never delete a later claim's.
const RequestsStream = "REQUESTS"

const (
	requestsPrefix = "requests."
	// requestsMinAge bounds how long a request whose deletion was lost (a crash between the
	// outcome's write and the delete) is kept: the bucket's TTL if longer. A record still
	// PENDING that long after its claim cannot be re-driven (its takeover fails it).
	requestsMinAge = 24 * time.Hour
	// DefaultInlineRequestMax is BucketConfig.InlineRequestMax when it is 0: a chat request
	// below it (nearly all) costs no extra write.
	DefaultInlineRequestMax = 64 << 10
)

// ErrRequestLost is returned when a record names a stored request that REQUESTS no longer
// holds: its claim's node died before it was written (no job was published then), or it
// outlived the stream's age.
var ErrRequestLost = errors.New("kv: the record's stored request is gone")

func openRequests(ctx context.Context, js jetstream.JetStream, ttl time.Duration, n int) (jetstream.Stream, error) {
	st, err := replicas.Ensure(ctx, js, jetstream.StreamConfig{
		Name:     RequestsStream,
		Subjects: []string{requestsPrefix + ">"},
		Storage:  jetstream.FileStorage,
		MaxAge:   max(ttl, requestsMinAge),
		Discard:  jetstream.DiscardOld,
		Replicas: n,
		// A direct get answers with the message as stored; the stream API's get wraps it in
		// JSON as base64, costing two more body-sized buffers on each side. Any replica answers
		// one, so a miss is asked of the leader again before a request is called lost (Request).
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("kv: open requests %s: %w", RequestsStream, err)
	}
	return st, nil
}

func requestSubject(key string, epoch int) string {
	return requestsPrefix + key + "." + strconv.Itoa(epoch)
}

// StoresRequest reports whether a request of n bytes is stored in REQUESTS rather than in
// its record.
func (s *Store) StoresRequest(n int) bool { return n > s.inlineMax }

// PutRequest stores rec's request for its key (rec.RequestAt names the epoch); call it after
// the claim and before the job is published. Retried like Claim (a retry may store it twice:
// both copies are the same bytes, and a read takes the last).
func (s *Store) PutRequest(ctx context.Context, key string, rec *Record) error {
	if rec.RequestAt == 0 {
		return nil
	}
	subj := requestSubject(key, rec.RequestAt)
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		_, err := jspub.Publish(ctx, s.js.Conn(), &nats.Msg{Subject: subj, Data: rec.Request})
		return err
	})
	if err != nil {
		return fmt.Errorf("kv: store request of %s: %w", key, err)
	}
	return nil
}

// Request reads the stored request of key's claim at epoch: a direct get, which a replica that
// has not caught up yet can miss, so a miss is read again from the stream's leader;
// ErrRequestLost when that has none either.
func (s *Store) Request(ctx context.Context, key string, epoch int) ([]byte, error) {
	var body []byte
	subj := requestSubject(key, epoch)
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		m, err := s.reqs.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			body, _, err = leaderLast(ctx, s.js, RequestsStream, subj)
			return err
		}
		if err != nil {
			return err
		}
		body = m.Data
		return nil
	})
	switch {
	case errors.Is(err, errGone):
		return nil, fmt.Errorf("kv: request of %s epoch %d: %w", key, epoch, ErrRequestLost)
	case err != nil:
		return nil, fmt.Errorf("kv: request of %s epoch %d: %w", key, epoch, err)
	}
	return body, nil
}

// DropRequest deletes the stored request of a finished record (nothing when it has none, or
// it is gone already). Best effort: what it leaves, the stream's age removes.
func (s *Store) DropRequest(ctx context.Context, key string, rec *Record) error {
	if rec.RequestAt == 0 || rec.State == Pending {
		return nil
	}
	err := s.reqs.Purge(ctx, jetstream.WithPurgeSubject(requestSubject(key, rec.RequestAt)))
	if err != nil {
		return fmt.Errorf("kv: drop request of %s: %w", key, err)
	}
	return nil
}
