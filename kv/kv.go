// Package kv is the idempotency state machine on the IDEM JetStream key-value bucket: one
// record per tenant+key, created atomically (the claim), then changed only by compare-and-set
// on its revision. The revision is the fencing token: a writer whose revision is stale gets
// ErrConflict and must stop.
//
// NATS errors never leave this package; callers branch on ErrExists, ErrConflict and
// ErrNotFound. A Store is safe for concurrent use.
package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/jspub"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/replicas"
)

// Bucket is the name of the idempotency bucket.
const Bucket = "IDEM"

// A job id leads to its record key two ways. A job answered 202 (and a retrievable one, a
// stored response) is indexed in IDEM itself, synced: its id is the client's only handle. A
// synchronous request's id is found through its execution's progress (ProgressStream), which
// names the record key and is kept per job id: the request path writes nothing for it (the
// memory stream JOBIDX that held one message per id did, until issue 36), and an id is found
// from the first send of its execution for as long as PROGRESS keeps it (an hour, the last
// progressMaxMsgs executions). A queued job's id, or one that ran on a bypassed request's local
// execution, answers 404; its key still works. JOBIDX, left by an older version, is no longer
// read or written (docs/operations/upgrading.md).

// Sentinel errors.
var (
	// ErrExists is returned by Claim when the key already has a record (owned by someone else).
	ErrExists = errors.New("kv: key exists")
	// ErrConflict is returned by Update when the record changed since the given revision.
	ErrConflict = errors.New("kv: revision conflict")
	// ErrNotFound is returned when the key has no record (never claimed, or expired).
	ErrNotFound = errors.New("kv: key not found")
	// ErrUnavailable is returned when NATS kept failing with transient errors (an election,
	// a reconnect) for the whole retry window; a write that returns it may or may not have
	// been applied (Landed tells). It is jsretry.ErrUnavailable.
	ErrUnavailable = jsretry.ErrUnavailable
	// ErrNotLanded is returned by Landed when the stream's leader still holds the record at
	// the write's base revision: the write was not applied, and the record did not move on.
	// It may still be pending on a server that led the stream when it was sent (a partition
	// healed before an election), so the writer may write again expecting the same revision
	// (at most one of the two can land) but must keep checking the first.
	ErrNotLanded = errors.New("kv: write not applied; the record is still at its revision")
)

// BucketConfig sizes the bucket.
type BucketConfig struct {
	// TTL is how long a key's record is kept after its last write.
	TTL time.Duration
	// HotTTL, when set below TTL, is how long the bucket itself keeps a record (the cold tier,
	// package cold, keeps it until TTL). Open never lowers an existing bucket's MaxAge to it:
	// the records older than HotTTL must be in the cold tier first (LowerToHot).
	HotTTL time.Duration
	// Replicas of the bucket, the job index, the progress and the requests streams (0 or 1:
	// one). Open keeps an existing stream's count when it is larger.
	Replicas int
	// InlineRequestMax is the largest request a record carries itself; a larger one is stored
	// in REQUESTS (see RequestsStream). 0: DefaultInlineRequestMax.
	InlineRequestMax int
	// Partition is the partition whose copies of the bucket and streams the store opens
	// (partition 0: IDEM, PROGRESS, REQUESTS; partition k: IDEM_P<k>, ...). A store holds the
	// records of its partition's keys only (partition.OfKey).
	Partition partition.P
	// Placement, when set, places the streams the store creates (a partition's own servers).
	Placement *jetstream.Placement
}

// names are a store's bucket, streams and subject spaces in its partition.
type names struct {
	bucket, stream, subjects string // IDEM, KV_IDEM, "$KV.IDEM."
	progress, progressPrefix string
	requests, requestsPrefix string
}

func namesOf(p partition.P) names {
	bucket := p.Stream(Bucket)
	return names{bucket: bucket, stream: "KV_" + bucket, subjects: "$KV." + bucket + ".",
		progress: p.Stream(ProgressStream), progressPrefix: p.Subject(progressPrefix),
		requests: p.Stream(RequestsStream), requestsPrefix: p.Subject(requestsPrefix)}
}

// Record messages carry their state and lease in headers, so a sweep can read every key's
// state with a headers-only consumer instead of downloading every record.
const (
	hdrState = "Og-State"
	hdrLease = "Og-Lease" // unix milliseconds; PENDING only
	hdrBill  = "Og-Bill"  // "1" on a finished record that has something to charge (Billable)
	// hdrWorker names the worker pool that stored a billable outcome, and charges it: the other
	// pools' charge sweeps leave the record to it while it runs (Finished.Worker).
	hdrWorker = "Og-Worker"
)

// Store is the IDEM bucket.
type Store struct {
	kv jetstream.KeyValue
	// prog is the progress stream (see ProgressStream).
	prog jetstream.Stream
	// reqs holds the requests too large for their records (see RequestsStream), above
	// inlineMax bytes.
	reqs      jetstream.Stream
	inlineMax int
	// storing lets one request's pieces be written at a time (PutRequest).
	storing chan struct{}
	// pieceBufs holds the buffers pieces are compressed into (newPieceBufs).
	pieceBufs *sync.Pool
	js        jetstream.JetStream
	ttl       time.Duration // the bucket's record TTL
	names     names
	// leader is when the bucket's leader was elected (Abandoned).
	leader *leaderClock
}

// Open creates or updates the bucket (file storage: records must survive a crash), the job
// index and the progress stream. It never lowers a replica count an operator raised, and it is
// also how a gateway recreates the two memory streams after a NATS restart lost them.
func Open(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (*Store, error) {
	n := namesOf(cfg.Partition)
	kvc := replicas.RecordsKV(n.bucket, bucketMaxAge(ctx, js, n.stream, cfg), cfg.Replicas)
	kvc.Placement = cfg.Placement
	kvs, err := replicas.EnsureKV(ctx, js, kvc)
	if err != nil {
		return nil, fmt.Errorf("kv: open bucket %s: %w", n.bucket, err)
	}
	prog, err := openProgress(ctx, js, n, cfg.Replicas, cfg.Placement)
	if err != nil {
		return nil, err
	}
	reqs, err := openRequests(ctx, js, n, cfg.TTL, cfg.Replicas, cfg.Placement)
	if err != nil {
		return nil, err
	}
	inlineMax := cfg.InlineRequestMax
	if inlineMax == 0 {
		inlineMax = DefaultInlineRequestMax
	}
	return &Store{kv: kvs, prog: prog, reqs: reqs, inlineMax: inlineMax, storing: make(chan struct{}, 1), pieceBufs: newPieceBufs(), js: js, ttl: cfg.TTL, leader: &leaderClock{}, names: n}, nil
}

// bucketMaxAge is the MaxAge Open gives the bucket: TTL, or HotTTL with a cold tier unless the
// bucket exists with a longer MaxAge (its records have not all been moved yet). Only a bucket
// known not to exist is made with HotTTL: a failed read (a timeout, an election) keeps the TTL,
// for a MaxAge lowered before the records are in the cold tier would expire them uncopied,
// and their keys would be new.
func bucketMaxAge(ctx context.Context, js jetstream.JetStream, stream string, cfg BucketConfig) time.Duration {
	if cfg.HotTTL <= 0 || cfg.HotTTL >= cfg.TTL {
		return cfg.TTL
	}
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return cfg.HotTTL
	}
	if err != nil {
		return cfg.TTL
	}
	return min(max(st.CachedInfo().Config.MaxAge, cfg.HotTTL), cfg.TTL)
}

// LowerToHot sets the bucket's MaxAge to hot (see BucketConfig.HotTTL): for the cold tier to
// call once it holds every record older than hot. p is the partition whose bucket it is (each
// has its own cold tier).
func LowerToHot(ctx context.Context, js jetstream.JetStream, p partition.P, hot time.Duration) error {
	name := namesOf(p).stream
	st, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("kv: %s: %w", name, err)
	}
	c := st.CachedInfo().Config
	if c.MaxAge <= hot {
		return nil
	}
	c.MaxAge = hot
	c.Duplicates = min(c.Duplicates, hot) // the server refuses a window longer than MaxAge
	if _, err := js.UpdateStream(ctx, c); err != nil {
		return fmt.Errorf("kv: lower %s to %s: %w", name, hot, err)
	}
	return nil
}

// BucketStream is the stream behind the bucket (partition 0's; Stream names the store's).
const BucketStream = "KV_" + Bucket

// Names of partition p's bucket: its stream (KV_IDEM_P<k>) and its keys' subject prefix
// ("$KV.IDEM_P<k>."), what the cold tier copies from.
func BucketNames(p partition.P) (stream, prefix string) {
	n := namesOf(p)
	return n.stream, n.subjects
}

// recordV2 is the record format that stores the request after the record's JSON; version 1
// (records written before it) had the request inside, as the "request" member.
const recordV2 = 2

// requestSeparator ends a version 2 record's JSON when a request follows. Compact JSON never
// contains a raw newline (encoding/json escapes it inside strings), so the first one is it.
const requestSeparator = '\n'

// Encode is the stored form of rec (the bytes Claim and Update write): the record as JSON,
// then, while it carries a request, a newline and the request's bytes as the client sent them.
// A request (a prompt of up to megabytes) is thus copied once, never scanned or escaped as
// JSON on the way in or out: with 64 KiB prompts, encoding it inside the JSON cost more CPU
// than anything else the gateway does per request. A request stored in REQUESTS
// (rec.RequestAt) is left out.
func Encode(rec *Record) ([]byte, error) {
	rec.V = recordV2
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("kv: encode: %w", err)
	}
	if len(rec.Request) == 0 || rec.RequestAt > 0 {
		return data, nil
	}
	out := make([]byte, 0, len(data)+1+len(rec.Request))
	out = append(append(append(out, data...), requestSeparator), rec.Request...)
	return out, nil
}

// Decode parses a stored record (as Encode wrote it, or a version 1 record). The request
// aliases data.
func Decode(data []byte) (*Record, error) {
	var rec Record
	head, request, split := bytes.Cut(data, []byte{requestSeparator})
	if err := json.Unmarshal(head, &rec); err != nil {
		return nil, fmt.Errorf("kv: decode: %w", err)
	}
	switch {
	case split && rec.V >= recordV2:
		rec.Request = request
	case split:
		return nil, fmt.Errorf("kv: decode: a version %d record with bytes after its JSON", rec.V)
	case rec.V < recordV2:
		var v1 struct {
			Request json.RawMessage `json:"request"`
		}
		if err := json.Unmarshal(data, &v1); err != nil {
			return nil, fmt.Errorf("kv: decode: %w", err)
		}
		rec.Request = v1.Request
	}
	return &rec, nil
}

// Claim creates the record for key; ErrExists if there is one. A retried create whose first
// try succeeded is recognised by the owner nonce and reported as success.
func (s *Store) Claim(ctx context.Context, key string, rec *Record) (uint64, error) {
	data, err := Encode(rec)
	if err != nil {
		return 0, err
	}
	return s.ClaimEncoded(ctx, key, rec, data)
}

// ClaimEncoded is Claim of rec already encoded as data (Encode(rec)), for a caller that also
// sends those bytes elsewhere. Transient NATS failures are retried (the same create, so it
// can only be applied once) until rec.AdmitBy when it is set, else for jsretry.Window, or
// until ctx ends; then ErrUnavailable.
//
// The claim carries what re-drives its job (DESIGN.md's durability budget) and is published
// with a Nats-Msg-Id (ClaimMsgID): the request's deduplicated JetStream message, for a job its
// node runs itself (a held job, which is stored nowhere else, issue 44) as for a queued one. On
// a cluster a try whose answer was lost is answered by the bucket's duplicate window with the
// revision it stored; one server checks the expected revision first, and the owner nonce
// answers it below.
func (s *Store) ClaimEncoded(ctx context.Context, key string, rec *Record, data []byte) (uint64, error) {
	var rev uint64
	until := rec.AdmitBy
	if until.IsZero() {
		until = time.Now().Add(jsretry.Window)
	}
	id := ClaimMsgID(key, rec)
	err := jsretry.Do(ctx, until, func(ctx context.Context) error {
		r, err := s.writeWithID(ctx, key, rec, data, 0, id)
		if err == nil {
			rev = r
			return nil
		}
		if !errors.Is(err, errWrongLast) {
			return err
		}
		// A retried create whose first try succeeded answers "exists" too on one server, or
		// once the duplicate window is past: the owner nonce says whose record it is.
		cur, curRev, gerr := s.get(ctx, key)
		switch {
		case gerr == nil && cur.Owner == rec.Owner && cur.Epoch == rec.Epoch:
			rev = curRev
			return nil
		case gerr == nil:
			return &ExistsError{Record: cur, Rev: curRev}
		case jsretry.Transient(gerr) || errors.Is(gerr, ErrNotFound):
			// Unreadable, or read from a replica that does not have the record yet: ours (a
			// try whose answer was lost) or another claimant's, which the leader has just
			// refused ours for. Nothing deletes records, so a refused create means a record
			// exists; the next try creates again or reads it. Before, a copy that raced its
			// intent's first claim on a cluster read "not found" from a lagging replica, and
			// all five of Admit's decisions did within milliseconds: 503 contended (12 of
			// 12,000 intents in a 10-minute run at 20/s on three stock servers).
			return jsretry.Again(gerr)
		}
		return ErrExists
	})
	if err != nil {
		return 0, fmt.Errorf("kv: claim %s: %w", key, err)
	}
	return rev, nil
}

// AdmittedLate reports whether rec, read at rev, is an admission's write (a claim or a
// reclaim: rec.AdmitBy is set) that the store stored after its AdmitBy: its API had refused
// the request by then (503 store_unavailable), so it never launched its job, and nothing may
// start an execution from it. Such a write arrives late when a client library held it
// through a reconnect or a network held it in a socket buffer. The stored time is the
// stream leader's clock and AdmitBy the API's: a leader clock behind the API's by more than
// the delay hides a late write, one ahead of it only releases a claim nobody launched
// in time.
func (s *Store) AdmittedLate(ctx context.Context, key string, rec *Record, rev uint64) (bool, error) {
	if rec.AdmitBy.IsZero() || rec.State != Pending {
		return false, nil
	}
	var stored time.Time
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		e, err := s.kv.GetRevision(ctx, key, rev)
		if err != nil {
			return err
		}
		stored = e.Created()
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("kv: stored time of %s at %d: %w", key, rev, err)
	}
	return stored.After(rec.AdmitBy), nil
}

// ExistsError is the ErrExists of a Claim that also read the record holding the key, so the
// caller need not read it again.
type ExistsError struct {
	Record *Record
	Rev    uint64
}

func (e *ExistsError) Error() string { return ErrExists.Error() }

// Is makes an ExistsError match ErrExists.
func (e *ExistsError) Is(target error) bool { return target == ErrExists }

// Get reads the record and its revision, retrying transient NATS failures for
// jsretry.Window or until ctx ends (then ErrUnavailable). The read may be served by any
// replica, so it can be stale: decisions are made by Claim and Update.
func (s *Store) Get(ctx context.Context, key string) (*Record, uint64, error) {
	var rec *Record
	var rev uint64
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		var err error
		rec, rev, err = s.get(ctx, key)
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("kv: get %s: %w", key, err)
	}
	return rec, rev, nil
}

// Latest reads key's record from the bucket stream's leader, which holds every committed
// write, where Get's direct read may be answered by a replica that has not caught up (after a
// partition's heal, a replica answered an intent that had finished as still PENDING, and a
// copy sent then was told "joined" instead of "replayed"). It costs a request to the leader:
// for decisions a stale record would get wrong. Retried like Get; ErrNotFound when the key has
// no record.
func (s *Store) Latest(ctx context.Context, key string) (*Record, uint64, error) {
	var rec *Record
	var rev uint64
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		var err error
		rec, rev, err = s.latest(ctx, key)
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("kv: latest %s: %w", key, err)
	}
	return rec, rev, nil
}

// latest is one try of Latest (and what get asks on a miss).
func (s *Store) latest(ctx context.Context, key string) (*Record, uint64, error) {
	data, rev, err := s.leaderLast(ctx, key)
	switch {
	case errors.Is(err, errGone):
		return nil, 0, ErrNotFound
	case err != nil:
		return nil, 0, err
	}
	rec, err := Decode(data)
	if err != nil {
		return nil, 0, err
	}
	return rec, rev, nil
}

// Held says whether the replica that answers holds a record for key, in one read without
// Get's retries or its leader check on a miss. A replica behind the leader can say no for a
// record just written: use it only where a wrong no costs a refusal the client retries.
func (s *Store) Held(ctx context.Context, key string) bool {
	_, err := s.kv.Get(ctx, key)
	return err == nil
}

// Peek reads key's record once from whichever replica answers, without Get's retries or its
// leader check on a miss: for work that must cost what one record read costs (intent's
// equal-time 404s), never for a decision. Its answer is discarded by design.
func (s *Store) Peek(ctx context.Context, key string) error {
	_, err := s.kv.Get(ctx, key)
	return err
}

// get is one try of Get. A miss is asked again of the stream's leader: a direct get is
// answered by any replica, and one that was cut off from the others answers from its old
// state until it has caught up. Row 3b's status read of an intent, right after a trial's
// heal, answered "no record" once (probably that; not proven). A stale record is the
// caller's to handle (see Get); a missing one is a wrong answer (a 404 for an intent that
// exists). Misses are rare: admission claims first.
func (s *Store) get(ctx context.Context, key string) (*Record, uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return s.latest(ctx, key)
		}
		return nil, 0, err
	}
	rec, err := Decode(e.Value())
	if err != nil {
		return nil, 0, err
	}
	return rec, e.Revision(), nil
}

// Update writes rec if the record is still at rev; ErrConflict otherwise. Transient NATS
// failures are retried for jsretry.Window or until ctx ends; then ErrUnavailable.
func (s *Store) Update(ctx context.Context, key string, rec *Record, rev uint64) (uint64, error) {
	return s.UpdateBefore(ctx, key, rec, rev, time.Now().Add(jsretry.Window))
}

// UpdateBefore is Update retrying transient NATS failures until until (or until ctx ends),
// for a writer whose right to write ends then (a lease).
//
// Every try expects the same revision, so the write is applied at most once. A try whose
// answer was lost may have been applied: a later try then finds the record moved on, and the
// record is read to tell our own write (success, at its revision) from another writer's
// (ErrConflict). ErrUnavailable means the write may or may not have been applied: see Landed.
func (s *Store) UpdateBefore(ctx context.Context, key string, rec *Record, rev uint64, until time.Time) (uint64, error) {
	data, err := Encode(rec)
	if err != nil {
		return 0, err
	}
	var nrev uint64
	unsure := false // a failed try may have been applied all the same
	err = jsretry.Do(ctx, until, func(ctx context.Context) error {
		r, err := s.write(ctx, key, rec, data, rev)
		switch {
		case err == nil:
		case errors.Is(err, errWrongLast) && unsure:
			r, err = s.landed(ctx, key, data, rev)
			if errors.Is(err, ErrNotLanded) {
				// Refused by a server that still holds our earlier try pending: write again
				// (each try expects rev, so only one can land).
				return jsretry.Again(err)
			}
		case errors.Is(err, errWrongLast):
			return ErrConflict
		default:
			// Not only a lost answer: a refusal during an election ("not leader", "cluster not
			// available") can come for a write its old leader had already replicated, which the
			// new leader then commits. The fault suite's partition row saw a worker take its
			// own COMPLETED for another writer's and abandon it. Reading costs one Get.
			unsure = true
			return err
		}
		nrev = r
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("kv: update %s at %d: %w", key, rev, err)
	}
	return nrev, nil
}

// Landed says whether rec, written over the record at rev by an Update that returned
// ErrUnavailable, was applied after all: its revision if the record holds exactly rec now,
// ErrConflict if the record moved on without it, ErrNotLanded if the leader still holds it
// at rev, ErrUnavailable if that cannot be read.
func (s *Store) Landed(ctx context.Context, key string, rec *Record, rev uint64) (uint64, error) {
	data, err := Encode(rec)
	if err != nil {
		return 0, err
	}
	var nrev uint64
	err = jsretry.Within(ctx, func(ctx context.Context) error {
		var err error
		nrev, err = s.landed(ctx, key, data, rev)
		return err
	})
	if errors.Is(err, ErrNotLanded) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("kv: landed %s after %d: %w", key, rev, err)
	}
	return nrev, nil
}

// landed is one try of Landed: the stored bytes of a record written after rev are ours only
// if they are exactly data (a record names its owner, epoch and times, so no other writer
// writes the same bytes). A read at rev or before comes from a replica behind its leader,
// which said the record is past rev: the leader is asked. A replica can stay behind for
// seconds: row 3b saw the server just healed from a partition answer a worker's direct gets
// with the old revision for a whole retry window while the lease ran out and a taker, whose
// reads came from elsewhere, took the execution over.
func (s *Store) landed(ctx context.Context, key string, data []byte, rev uint64) (uint64, error) {
	e, err := s.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return 0, ErrConflict // gone: nothing we wrote is there
	case err != nil:
		return 0, err
	case e.Revision() <= rev:
		stored, srev, err := s.leaderLast(ctx, key)
		switch {
		case errors.Is(err, errGone):
			return 0, ErrConflict
		case err != nil:
			return 0, jsretry.Again(fmt.Errorf("a replica still at revision %d, the leader unread: %w", e.Revision(), err))
		case srev == rev:
			return 0, ErrNotLanded
		case srev < rev:
			return 0, jsretry.Again(fmt.Errorf("the leader still at revision %d", srev))
		case bytes.Equal(stored, data):
			return srev, nil
		}
		return 0, ErrConflict
	case bytes.Equal(e.Value(), data):
		return e.Revision(), nil
	}
	return 0, ErrConflict
}

// errGone: the key has no record (never written, deleted, or expired).
var errGone = errors.New("no record")

// leaderLast reads key's last message from the bucket stream's leader, which a message get
// of the stream API (unlike a direct get, answered by any replica) always is.
func (s *Store) leaderLast(ctx context.Context, key string) ([]byte, uint64, error) {
	return leaderLast(ctx, s.js, s.names.stream, s.names.subjects+key)
}

// leaderLast reads the last message on subject of stream from its leader; errGone when there
// is none (or it is a KV delete, purge or expiry marker).
func leaderLast(ctx context.Context, js jetstream.JetStream, stream, subject string) ([]byte, uint64, error) {
	m, err := leaderLastMsg(ctx, js, stream, subject)
	if err != nil {
		return nil, 0, err
	}
	return m.Data, m.Seq, nil
}

// leaderLastMsg is leaderLast with the message's headers.
func leaderLastMsg(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jsleader.Msg, error) {
	m, err := jsleader.Get(ctx, js.Conn(), jsleader.APIPrefix(js), stream, jsleader.Request{LastBySubject: subject})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, errGone
	case err != nil:
		return nil, fmt.Errorf("kv: leader read of %s: %w", subject, err)
	case bytes.Contains(m.Headers, []byte("KV-Operation")) || bytes.Contains(m.Headers, []byte("Nats-Marker-Reason")):
		return nil, errGone // a delete or purge, or the marker of an expiry
	}
	return m, nil
}

var errWrongLast = errors.New("wrong last sequence")

// write is a KV put conditional on the key's last revision (0: the key must not exist),
// exactly what kv.Create and kv.Update send, plus the state headers.
func (s *Store) write(ctx context.Context, key string, rec *Record, data []byte, rev uint64) (uint64, error) {
	return s.writeWithID(ctx, key, rec, data, rev, "")
}

// ClaimMsgID is the Nats-Msg-Id of rec's claim of key: the claimant's owner nonce and its job's
// id are in it, so two claimants racing for a key are never taken for copies of one another,
// nor a key claimed again after its record expired for a copy of the last claim. Empty (no
// deduplication) for a record without an owner.
func ClaimMsgID(key string, rec *Record) string {
	if rec.Owner == "" {
		return ""
	}
	return "claim." + key + "." + strconv.Itoa(rec.Epoch) + "." + rec.JobID + "." + rec.Owner
}

// writeWithID is write with a Nats-Msg-Id (none when msgID is empty).
func (s *Store) writeWithID(ctx context.Context, key string, rec *Record, data []byte, rev uint64, msgID string) (uint64, error) {
	m := nats.NewMsg(s.names.subjects + key)
	m.Data = data
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	m.Header.Set(hdrState, string(rec.State))
	if rec.State == Pending && !rec.LeaseUntil.IsZero() {
		m.Header.Set(hdrLease, strconv.FormatInt(rec.LeaseUntil.UnixMilli(), 10))
		if rec.Worker != "" {
			m.Header.Set(hdrWorker, rec.Worker) // for the sweeps' owner checks (LeaseWatch.Owned)
		}
	}
	if rec.Billable() {
		m.Header.Set(hdrBill, "1")
		if rec.Worker != "" {
			m.Header.Set(hdrWorker, rec.Worker)
		}
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	ack, err := jspub.Publish(ctx, s.js.Conn(), m)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, errWrongLast
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// Stream is the name of the stream behind the store's bucket (KV_IDEM, KV_IDEM_P1, ...).
func (s *Store) Stream() string { return s.names.stream }

// Expired is a PENDING record whose lease ran out, found by LeaseWatch.Expired.
type Expired struct {
	Key        string
	LeaseUntil time.Time
}

// jobIndexKey is where a job id points at its record key (same bucket, same TTL).
func jobIndexKey(jobID string) string { return "job." + jobID }

// JobIndexKey is the key under which IndexJob stores job jobID's record key: the cold tier
// keeps it as it keeps records (its value is the record key).
func JobIndexKey(jobID string) string { return jobIndexKey(jobID) }

// IndexJob records that job jobID belongs to record key, in the synced bucket, and waits: for
// the jobs whose id is the client's only handle (answered 202, or retrievable). A put of the
// same value is idempotent, so a try whose answer was lost is simply sent again. The caller
// must have validated jobID (a ULID).
func (s *Store) IndexJob(ctx context.Context, jobID, key string) error {
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		_, err := s.kv.Put(ctx, jobIndexKey(jobID), []byte(key))
		return err
	})
	if err != nil {
		return fmt.Errorf("kv: index job %s: %w", jobID, err)
	}
	return nil
}

// fireAndForget publishes data to a stream's subject with no reply subject: the server stores
// it and answers nothing. For writes nobody waits for and whose loss only delays a read
// (progress): an async publish's ack was never looked at, and receiving and matching it cost
// the gateway an inbound message and a pending-ack entry per write.
func (s *Store) fireAndForget(subject string, data []byte) error {
	return s.js.Conn().Publish(subject, data)
}

// JobKey returns the record key of job jobID (the synced index, else its execution's
// progress); ErrNotFound if unknown.
func (s *Store) JobKey(ctx context.Context, jobID string) (string, error) {
	var e jetstream.KeyValueEntry
	err := jsretry.Within(ctx, func(ctx context.Context) (err error) {
		e, err = s.kv.Get(ctx, jobIndexKey(jobID))
		return err
	})
	switch {
	case err == nil:
		return string(e.Value()), nil
	case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
		return "", fmt.Errorf("kv: job %s: %w", jobID, err)
	}
	p, err := s.lastProgressOf(ctx, jobID)
	if err != nil {
		return "", fmt.Errorf("kv: job %s: %w", jobID, err)
	}
	return p.Key, nil
}
