package ledger

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// wireVersion is the version of the canonical and stored encoding of an unkeyed entry (its
// hash is SHA-256), keyedVersion that of a keyed entry (its hash is an HMAC-SHA-256 under the
// ledger's secret, and starts with KeyedPrefix). The version is in the bytes the hash covers.
const (
	wireVersion  = 1
	keyedVersion = 2
)

// KeyedPrefix starts the Hash of a keyed entry: "hmac:" and 64 hex digits. An unkeyed entry's
// Hash is the 64 hex digits alone. The prefix is part of the next entry's PrevHash, so the
// scheme of every entry but a chain's last is covered by its successor's hash.
const KeyedPrefix = "hmac:"

// MinSecretLen is the shortest secret WithSecret and VerifyOptions accept: 32 bytes, the
// size of the HMAC-SHA-256 output.
const MinSecretLen = 32

// Keyed reports whether e's hash is keyed (an HMAC under the ledger's secret).
func Keyed(e *Entry) bool { return strings.HasPrefix(e.Hash, KeyedPrefix) }

// CheckSecret returns an ErrInvalid when secret is too short to key the chain.
func CheckSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%w: the ledger secret is %d bytes, want at least %d", ErrInvalid, len(secret), MinSecretLen)
	}
	return nil
}

// canonical is the hashed form of an entry: every field but Hash and Seq, in a fixed order,
// nothing omitted, the time in UTC RFC 3339 with nanoseconds.
type canonical struct {
	V            int    `json:"v"`
	ID           string `json:"id"`
	Kind         string `json:"kind"`
	Tenant       string `json:"tenant"`
	KeyHash      string `json:"key_hash"`
	JobID        string `json:"job_id"`
	Epoch        int    `json:"epoch"`
	Attempt      int    `json:"attempt"`
	Model        string `json:"model"`
	Backend      string `json:"backend"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	Estimated    bool   `json:"estimated"`
	Completed    bool   `json:"completed"`
	CostMicros   int64  `json:"cost_micros"`
	Currency     string `json:"currency"`
	Refers       string `json:"refers"`
	Reason       string `json:"reason"`
	Time         string `json:"time"`
	Fence        uint64 `json:"fence"`
	PrevHash     string `json:"prev_hash"`
}

// stored is what a LEDGER message holds: the canonical fields plus the hash.
type stored struct {
	canonical
	Hash string `json:"hash"`
}

func canonicalOf(e *Entry, v int) canonical {
	return canonical{V: v, ID: e.ID, Kind: e.Kind, Tenant: e.Tenant, KeyHash: e.KeyHash, JobID: e.JobID,
		Epoch: e.Epoch, Attempt: e.Attempt, Model: e.Model, Backend: e.Backend, InputTokens: e.InputTokens,
		OutputTokens: e.OutputTokens, Estimated: e.Estimated, Completed: e.Completed, CostMicros: e.CostMicros,
		Currency: e.Currency, Refers: e.Refers, Reason: e.Reason, Time: e.Time.UTC().Format(time.RFC3339Nano),
		Fence: e.Fence, PrevHash: e.PrevHash}
}

// CanonicalBytes are the bytes an unkeyed entry's hash covers: its JSON without Hash and Seq,
// fields in a fixed order, the time in UTC RFC 3339 with nanoseconds, "v" 1. A keyed entry's
// HMAC covers the same with "v" 2.
func CanonicalBytes(e *Entry) []byte { return canonicalBytes(e, wireVersion) }

func canonicalBytes(e *Entry, v int) []byte {
	b, err := json.Marshal(canonicalOf(e, v))
	if err != nil { // strings, ints and bools always marshal
		panic(fmt.Sprintf("ledger: canonical bytes: %v", err))
	}
	return b
}

// HashOf computes an unkeyed entry's hash: hex(SHA-256(PrevHash || CanonicalBytes)).
func HashOf(e *Entry) string {
	h := sha256.New()
	h.Write([]byte(e.PrevHash))
	h.Write(CanonicalBytes(e))
	return hex.EncodeToString(h.Sum(nil))
}

// KeyedHashOf computes a keyed entry's hash: KeyedPrefix + hex(HMAC-SHA-256(secret, PrevHash
// || canonical bytes with "v" 2)).
func KeyedHashOf(secret []byte, e *Entry) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(e.PrevHash))
	m.Write(canonicalBytes(e, keyedVersion))
	return KeyedPrefix + hex.EncodeToString(m.Sum(nil))
}

// hashOf is e's hash under the ledger's scheme: keyed when it has a secret.
func (l *Ledger) hashOf(e *Entry) string {
	if l.secret != nil {
		return KeyedHashOf(l.secret, e)
	}
	return HashOf(e)
}

func encodeStored(e *Entry) []byte {
	v := wireVersion
	if Keyed(e) {
		v = keyedVersion
	}
	b, err := json.Marshal(stored{canonical: canonicalOf(e, v), Hash: e.Hash})
	if err != nil {
		panic(fmt.Sprintf("ledger: encode entry: %v", err))
	}
	return b
}

// decodeStored parses a LEDGER message body.
func decodeStored(data []byte, seq uint64) (Entry, error) {
	s, ok := fastDecode(data)
	if !ok {
		s = stored{}
		if err := json.Unmarshal(data, &s); err != nil {
			return Entry{}, fmt.Errorf("%w: seq %d: %v", ErrCorrupt, seq, err)
		}
	}
	if s.V != wireVersion && s.V != keyedVersion {
		return Entry{}, fmt.Errorf("%w: seq %d: version %d", ErrCorrupt, seq, s.V)
	}
	if keyed := strings.HasPrefix(s.Hash, KeyedPrefix); keyed != (s.V == keyedVersion) {
		return Entry{}, fmt.Errorf("%w: seq %d: version %d with a hash of the other scheme", ErrCorrupt, seq, s.V)
	}
	t, err := time.Parse(time.RFC3339Nano, s.Time)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: seq %d: time: %v", ErrCorrupt, seq, err)
	}
	c := s.canonical
	return Entry{ID: c.ID, Kind: c.Kind, Tenant: c.Tenant, KeyHash: c.KeyHash, JobID: c.JobID, Epoch: c.Epoch,
		Attempt: c.Attempt, Model: c.Model, Backend: c.Backend, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens,
		Estimated: c.Estimated, Completed: c.Completed, CostMicros: c.CostMicros, Currency: c.Currency, Refers: c.Refers,
		Reason: c.Reason, Time: t.UTC(), Fence: c.Fence, PrevHash: c.PrevHash, Hash: s.Hash, Seq: seq}, nil
}

// idDigest keys the in-memory id index (16 bytes instead of the id string).
type idDigest [16]byte

func digest(id string) idDigest {
	sum := sha256.Sum256([]byte(id))
	var d idDigest
	copy(d[:], sum[:16])
	return d
}

// chain is what this process knows of one tenant's chain: its head and the ids of its entries
// up to lastSeq (with a dedup horizon, only of the entries stored within it: partial). Guarded
// by mu, which also serializes this process's appends to the tenant.
type chain struct {
	mu chanMutex
	// qmu guards queue: the appends waiting for a holder of mu to commit them (append.go).
	qmu      sync.Mutex
	queue    []*pending
	tenant   string
	subject  string
	loaded   bool
	partial  bool
	lastSeq  uint64 // stream sequence of the tenant's last entry (0: none)
	lastHash string
	ids      map[idDigest]uint64
	// With a dedup horizon, byTime lists the ids in the order they were added, with their
	// entries' times, so that ids older than the horizon are forgotten as newer ones come (a
	// fresh process never loads them either): the index stays the size of one horizon of
	// entries instead of growing for the life of the process.
	horizon time.Duration
	byTime  []idAt
	// complete is the store time from which every entry of the chain is in ids (zero: all of
	// them): an id that was stored after complete and is not in ids was never stored, and
	// needs no read of the stream. Without it, once the horizon first forgot an id, every new
	// charge read a minute or more of the tenant's entries under the chain lock (its After
	// less clockMargin): the soak's workers queued on that lock after 13-15 minutes.
	complete time.Time
}

type idAt struct {
	d  idDigest
	at time.Time
}

// remember indexes an entry's id at seq, and forgets the ids that fell out of the horizon.
func (c *chain) remember(d idDigest, seq uint64, at time.Time) {
	c.ids[d] = seq
	if c.horizon <= 0 {
		return
	}
	c.byTime = append(c.byTime, idAt{d: d, at: at})
	cutoff := at.Add(-c.horizon)
	n := 0
	for n < len(c.byTime) && c.byTime[n].at.Before(cutoff) {
		delete(c.ids, c.byTime[n].d)
		n++
	}
	if n > 0 {
		c.byTime = c.byTime[n:]
		c.partial = true // older ids are looked up in the stream
		if cutoff.After(c.complete) {
			c.complete = cutoff
		}
	}
}

// chanMutex is a mutex whose Lock can give up when a context ends.
type chanMutex chan struct{}

func (m chanMutex) Lock() { m <- struct{}{} }
func (m chanMutex) LockCtx(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (m chanMutex) Unlock() { <-m }

func (l *Ledger) chain(tenant string) *chain {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.chains[tenant]
	if c == nil {
		tenant = strings.Clone(tenant) // kept: never a caller's borrowed bytes (a Fiber handler's)
		c = &chain{mu: make(chanMutex, 1), tenant: tenant, subject: l.subject(tenant), horizon: l.horizon}
		l.chains[tenant] = c
	}
	return c
}

// add records e (read from the stream, in order) in the chain state.
func (c *chain) add(e *Entry) error {
	if e.Tenant != c.tenant {
		return fmt.Errorf("%w: seq %d on the subject of another tenant", ErrCorrupt, e.Seq)
	}
	c.remember(digest(e.ID), e.Seq, e.Time)
	c.lastSeq, c.lastHash = e.Seq, e.Hash
	return nil
}

// sync brings the chain state up to the stream: on first use the head and the ids (all of
// them, or those within the dedup horizon), the new entries after, up to the leader's head,
// or at least to upTo when it is not zero (a head a refused publish named). The caller holds
// c.mu.
func (c *chain) sync(ctx context.Context, l *Ledger, upTo uint64) error {
	if c.loaded {
		return l.follow(ctx, c.subject, c.lastSeq+1, upTo, c.add)
	}
	c.ids, c.byTime = map[idDigest]uint64{}, nil
	c.lastSeq, c.lastHash = 0, ""
	if l.horizon <= 0 {
		if err := l.scan(ctx, c.subject, span{}, c.add); err != nil {
			return err
		}
		c.loaded = true
		return nil
	}
	st, err := l.stream(ctx)
	if err != nil || st == nil {
		if err == nil {
			c.loaded = true
		}
		return err
	}
	head, headTime, err := l.last(ctx, st, c.subject)
	if err != nil {
		return err
	}
	since := time.Now().Add(-l.horizon) // compared with the server's store times
	if head != 0 && headTime.Before(since) {
		e, err := l.entryAt(ctx, head)
		if err != nil {
			return err
		}
		if err := c.add(&e); err != nil {
			return err
		}
	} else if err := l.scan(ctx, c.subject, span{since: since, end: head}, c.add); err != nil {
		return err
	}
	c.loaded, c.partial, c.complete = true, true, since
	return nil
}

// clockMargin widens a time-bounded read for the difference between the appender's clock and
// the server's.
const clockMargin = time.Minute

// lookup finds id in the tenant's entries: in the index, synced first; else, with a dedup
// horizon, among the older entries, those stored since after less clockMargin (all of them
// when after is zero). The caller must not hold c.mu: the index is read under it and the
// stream outside it, so that a long read never holds up the tenant's appends (row 18's soak:
// a restarted worker's charge sweep, repeating charges of 9-10 minute old records, read a
// minute of entries per charge under the lock, and every worker's charges queued behind).
// Entries appended after the read's end are in the index by the time an append could race
// them: an append publishes only at the head the index has seen.
func (c *chain) lookup(ctx context.Context, l *Ledger, id string, after time.Time) (uint64, bool, error) {
	d := digest(id)
	if err := c.mu.LockCtx(ctx); err != nil {
		return 0, false, err
	}
	seq, ok := c.ids[d]
	var err error
	if !ok || !c.loaded {
		if err = c.sync(ctx, l, 0); err == nil {
			seq, ok = c.ids[d]
		}
	}
	partial, complete, end := c.partial, c.complete, c.lastSeq
	c.mu.Unlock()
	if err != nil || ok || !partial {
		return seq, ok, err
	}
	if !after.IsZero() && !after.Add(-clockMargin).Before(complete) {
		return 0, false, nil // stored after complete, if at all: the index would hold it
	}
	errFound := errors.New("found")
	sp := span{end: end}
	if !after.IsZero() {
		sp.since = after.Add(-clockMargin)
	}
	seq = 0
	err = l.scan(ctx, c.subject, sp, func(e *Entry) error {
		if e.ID == id {
			seq = e.Seq
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return 0, false, err
	}
	return seq, seq != 0, nil
}

func wrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// headIn is the subject's last sequence that a refusal for a stale head names (nats-server
// says "wrong last sequence: N"); 0 when it names none.
func headIn(err error) uint64 {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return 0
	}
	_, n, _ := strings.Cut(apiErr.Description, ":")
	seq, perr := strconv.ParseUint(strings.TrimSpace(n), 10, 64)
	if perr != nil {
		return 0
	}
	return seq
}

// ChainError says where and why Check found the chain broken. It matches ErrChainBroken.
type ChainError struct {
	Index     int    // position in the verified slice
	Seq       uint64 // the entry's stream sequence (in its partition's stream), if known
	ID        string
	Tenant    string
	Partition int // of the chain (the entry's key hash's)
	Reason    string
}

func (e *ChainError) Error() string {
	if e.Partition != 0 {
		return fmt.Sprintf("ledger: chain broken at entry %d (partition %d, seq %d, id %s): %s", e.Index, e.Partition, e.Seq, e.ID, e.Reason)
	}
	return fmt.Sprintf("ledger: chain broken at entry %d (seq %d, id %s): %s", e.Index, e.Seq, e.ID, e.Reason)
}

// Unwrap makes a ChainError match ErrChainBroken.
func (e *ChainError) Unwrap() error { return ErrChainBroken }

// Verify is Check without a secret or an anchor: it returns the first finding, else an
// ErrUnchecked if keyed entries were not checked, else nil.
func Verify(entries []Entry) error { return Check(entries, VerifyOptions{}).Err() }
