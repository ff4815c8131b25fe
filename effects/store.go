package effects

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/replicas"
)

// Bucket is the effects bucket; BucketStream the stream behind it.
const (
	Bucket       = "OG_EFFECTS"
	BucketStream = "KV_" + Bucket
)

// ErrUnavailable is returned when NATS kept failing for the whole retry window; the write
// may or may not have been applied, and the same request sent again decides on what was
// (every write is recognised as its own by its nonce, fence or result). It is
// jsretry.ErrUnavailable.
var ErrUnavailable = jsretry.ErrUnavailable

// MaxListed bounds the entries List returns for one intent.
const MaxListed = 1000

// Config sizes the bucket.
type Config struct {
	// TTL is how long an entry is kept after its last write: the idempotency TTL, so an
	// effect is remembered as long as the answer that named it is replayed.
	TTL time.Duration
	// Replicas of the bucket (0 or 1: one). Open keeps an existing bucket's count when larger.
	Replicas int
	// Now is the rules' clock (leases); time.Now when nil.
	Now func() time.Time
}

// Store is the OG_EFFECTS bucket.
type Store struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	ttl time.Duration
	now func() time.Time
}

// Open creates or updates the bucket (file storage: an effect's record must survive a crash),
// never lowering a replica count an operator raised.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	kvs, err := replicas.EnsureKV(ctx, js, replicas.RecordsKV(Bucket, cfg.TTL, cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("effects: open bucket %s: %w", Bucket, err)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Store{kv: kvs, js: js, ttl: cfg.TTL, now: now}, nil
}

// TTL is the bucket's entry TTL (a lease longer than it could outlive its entry).
func (s *Store) TTL() time.Duration { return s.ttl }

// ID names one effect: its tenant, its intent's record key (32 lower-case hex digits, as
// intent.LookupKey makes it) and its name.
type ID struct {
	Tenant, Intent, Name string
}

// EffectKey is the effect's stable key, the same for every claim and retry: 32 hex digits of
// SHA-256 over the tenant, the intent's record key and the name. The caller passes it
// downstream as that system's idempotency key, so even a run after an unknown outcome is
// deduplicated there when the system supports it.
func (id ID) EffectKey() string { return hashHex(32, id.Tenant, "effect", id.Intent, id.Name) }

// key is the entry's bucket key: hashes only, the intent's first so List filters on it.
func (id ID) key() (string, error) {
	if !isHex(id.Intent, 32) {
		return "", fmt.Errorf("effects: intent %q is not a record key", id.Intent)
	}
	return intentPrefix(id.Tenant, id.Intent) + "." + id.EffectKey(), nil
}

func intentPrefix(tenant, intentKey string) string {
	return hashHex(16, "tenant", tenant) + "." + intentKey
}

// hashHex is the first n hex digits of SHA-256 over parts, each ended by a NUL.
func hashHex(n int, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:n]
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Claim claims effect id. It returns the entry and nil when the caller now holds it
// (State Claimed: run the effect, then Complete with its Fence) or when it completed before
// (State Completed: Result is the recorded result); the entry and ErrInProgress while another
// caller holds it, or ErrNeedsReconcile while its outcome is unknown; ErrFingerprint when it
// was claimed with other arguments. A claim sent again with the same req.Nonce (a client's
// retry after a lost answer) is recognised as the same claim; without one, Claim draws one.
func (s *Store) Claim(ctx context.Context, id ID, req ClaimRequest) (*Entry, error) {
	req.Name = id.Name
	if req.Nonce == "" {
		req.Nonce = rand.Text()
	}
	return s.apply(ctx, id, func(cur *Entry, now time.Time) (*Entry, error) { return claim(cur, req, now) })
}

// Complete records result (valid JSON, kept byte for byte) as the effect's, for the holder
// of fence. The same completion sent again returns the completed entry.
func (s *Store) Complete(ctx context.Context, id ID, fence uint64, result []byte) (*Entry, error) {
	if !json.Valid(result) {
		return nil, errors.New("effects: the result is not valid JSON")
	}
	return s.apply(ctx, id, func(cur *Entry, now time.Time) (*Entry, error) { return complete(cur, fence, result, now) })
}

// Renew extends the claim held by fence to lease from now, for an effect that runs longer
// than its first lease.
func (s *Store) Renew(ctx context.Context, id ID, fence uint64, lease time.Duration) (*Entry, error) {
	return s.apply(ctx, id, func(cur *Entry, now time.Time) (*Entry, error) { return renew(cur, fence, lease, now) })
}

// Unknown records, for the holder of fence, that it cannot tell whether the effect ran: the
// entry needs reconciling.
func (s *Store) Unknown(ctx context.Context, id ID, fence uint64) (*Entry, error) {
	return s.apply(ctx, id, func(cur *Entry, now time.Time) (*Entry, error) { return unknown(cur, fence, now) })
}

// Release records, for the holder of fence, that the effect surely did not run: the next
// claim runs it.
func (s *Store) Release(ctx context.Context, id ID, fence uint64) (*Entry, error) {
	return s.apply(ctx, id, func(cur *Entry, now time.Time) (*Entry, error) { return release(cur, fence, now) })
}

// errMoved: a write's compare-and-set lost to another writer; the entry is read again.
var errMoved = errors.New("effects: the entry moved on")

// apply reads the entry from the bucket stream's leader, decides with rule, and writes its
// answer by compare-and-set on the revision read, until the write lands or is not needed.
// A lost race, and transient NATS failures, decide again on what is stored then (for at most
// jsretry.Window, or until ctx ends: ErrUnavailable); a write whose answer was lost is found
// by the rule as its own (nonce, fence, result).
func (s *Store) apply(ctx context.Context, id ID, rule func(cur *Entry, now time.Time) (*Entry, error)) (*Entry, error) {
	key, err := id.key()
	if err != nil {
		return nil, err
	}
	var out *Entry
	var answer error
	err = jsretry.Within(ctx, func(ctx context.Context) error {
		cur, rev, err := s.latest(ctx, key)
		if err != nil {
			return err
		}
		next, rerr := rule(cur, s.now())
		if next == nil {
			out, answer = cur, rerr
			return nil
		}
		data, err := encode(next)
		if err != nil {
			return err
		}
		if _, err := s.kv.Update(ctx, key, data, rev); err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
				return jsretry.Again(errMoved)
			}
			return err
		}
		out, answer = next, rerr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("effects: %s: %w", key, err)
	}
	if answer != nil {
		return out, fmt.Errorf("effects: %s: %w", key, answer)
	}
	return out, nil
}

// latest reads the entry at key from the bucket stream's leader, which holds every committed
// write (a direct get may be answered by a replica behind it); nil and 0 when there is none.
func (s *Store) latest(ctx context.Context, key string) (*Entry, uint64, error) {
	m, err := jsleader.Get(ctx, s.js.Conn(), jsleader.APIPrefix(s.js), BucketStream, jsleader.Request{LastBySubject: subjectPrefix + key})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, err
	case bytes.Contains(m.Headers, []byte("KV-Operation")) || bytes.Contains(m.Headers, []byte("Nats-Marker-Reason")):
		return nil, m.Seq, nil // deleted, purged or expired: a claim creates it again over this revision
	}
	e, err := decode(m.Data)
	if err != nil {
		return nil, 0, err
	}
	return e, m.Seq, nil
}

const subjectPrefix = "$KV." + Bucket + "."

// List is every effect of tenant's intent (its record key), at most MaxListed, as the
// replica that answers has them.
func (s *Store) List(ctx context.Context, tenant, intentKey string) ([]*Entry, error) {
	if !isHex(intentKey, 32) {
		return nil, fmt.Errorf("effects: intent %q is not a record key", intentKey)
	}
	var out []*Entry
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		out = out[:0]
		w, err := s.kv.Watch(ctx, intentPrefix(tenant, intentKey)+".*", jetstream.IgnoreDeletes())
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case e, ok := <-w.Updates():
				if !ok || e == nil || len(out) >= MaxListed {
					return nil // nil: every stored entry has been delivered
				}
				d, err := decode(e.Value())
				if err != nil {
					return err
				}
				out = append(out, d)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("effects: list: %w", err)
	}
	return out, nil
}

// resultSeparator ends an entry's JSON when a result follows (compact JSON holds no raw
// newline).
const resultSeparator = '\n'

func encode(e *Entry) ([]byte, error) {
	head, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("effects: encode: %w", err)
	}
	if len(e.Result) == 0 {
		return head, nil
	}
	return append(append(head, resultSeparator), e.Result...), nil
}

func decode(data []byte) (*Entry, error) {
	head, result, _ := bytes.Cut(data, []byte{resultSeparator})
	var e Entry
	if err := json.Unmarshal(head, &e); err != nil {
		return nil, fmt.Errorf("effects: decode: %w", err)
	}
	if len(result) > 0 {
		e.Result = bytes.Clone(result)
	}
	return &e, nil
}
