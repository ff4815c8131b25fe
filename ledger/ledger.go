// Package ledger is oncegate's billing ledger: an append-only JetStream stream (LEDGER) of
// charges, continuations and reversals, hash-chained per tenant, with bills, exports, a
// reconciler that reverses charges billing one intent twice, a matcher for a provider's usage
// export, optional per-tenant budgets, and the tally of executions avoided (OG_TALLY).
//
// # The stream
//
// LEDGER is a file stream (the embedded server syncs every write) that refuses message
// deletes, purges and rollups, discards new messages when full (it never evicts), keeps no
// age limit and deduplicates Nats-Msg-Id for DuplicateWindow. Each tenant has one subject,
// ledger.<hash of the tenant id> (client text never becomes a subject). DenyDelete and
// DenyPurge do not stop UpdateStream or DeleteStream: deny those API subjects to everyone but an
// admin, and mirror the stream (see shared/notes, D6).
//
// # Partitions
//
// A store of several partitions has one ledger stream per partition (LEDGER, LEDGER_P1, ...;
// subjects p<k>.ledger.<hash>), and a Ledger is bound to one (WithPartition). Each
// partition's stream holds its own chain per tenant: an intent and all its entries live in the
// partition of its key, nothing needs an order across partitions, and an append stays on its
// partition's leader. A Set holds one Ledger per partition: writers use the one of their
// key's partition, readers (bills, exports, verify, Reconcile, Budgets) read them all.
// OG_TALLY and BudgetBucket are single, tenant-wide, for every partition.
//
// # Entries
//
// An entry is a charge (one backend execution's usage, priced from a Prices table into integer
// micro-units of one currency), a continuation (the usage of a stream continuation, linked to
// its charge), or a reversal (cancels a charge or continuation by id; nothing is ever edited or
// removed). Ids are deterministic:
//
//	charge.<key hash>.<job id>.<epoch>.<attempt>
//	continuation.<key hash>.<job id>.<epoch>.<attempt>
//	reversal.<id of the reversed entry>
//
// The job id is part of the intent: a key whose record expired, or an auto key reused for a new
// intent, starts a new job, whose charges must not collide with the old ones.
//
// # The chain and appends
//
// Every entry carries Hash = hex(SHA-256(PrevHash || canonical bytes)), where PrevHash is the
// Hash of the previous entry of the same tenant ("" for the first) and the canonical bytes are
// the entry's JSON without Hash and Seq (see CanonicalBytes). With a secret (WithSecret) the
// chain is keyed: Hash = "hmac:" + hex(HMAC-SHA-256(secret, PrevHash || canonical bytes)), the
// canonical bytes saying "v" 2; unkeyed entries written before still verify (see Check, and
// Heads for anchoring each tenant's head outside the ledger). An append publishes with
// Nats-Msg-Id = the entry id and WithExpectLastSequencePerSubject(the tenant's last sequence);
// on a conflict it re-reads the tenant's new entries (one batched direct get from the local
// replica, then the leader for what that replica lacks), recomputes PrevHash and tries again, so
// a tenant's chain never forks, across goroutines, connections and processes. Before each
// publish it looks the id up in the tenant's entries (an index of ids it keeps in memory,
// loaded from the stream on first use: the whole history, or the entries stored within
// WithDedupHorizon), and an append that may repeat an older entry (ChargeInput.After) also
// reads the tenant's entries stored since that time: an entry that exists is returned, never
// written twice. JetStream checks
// the expected sequence before the duplicate window, so this check, not Nats-Msg-Id, is what
// makes a re-published charge harmless; the message id (DuplicateWindow) is the second net.
//
// # Reading
//
// Entries, Bill and Scan read a tenant's subject (or the whole stream) with one ordered
// consumer and filter on Entry.Time, the appender's clock: their cost grows with the ledger,
// not with the period asked for. Reconcile keeps a compact summary of what it read (about 100
// bytes per intent; with WithReconcileHorizon, of one horizon of intents) and reads only new
// entries on its next run.
//
// Fencing: a charge records the idempotency record revision its writer held (Fence), and
// ChargeInput.Expect, when set, is called before every publish attempt so the writer can
// re-check its fencing token; a failed check returns ErrFenced. A zombie whose lease was taken
// over writes a charge of its own epoch (a different id); Reconcile finds such double charges.
//
// # Executions avoided
//
// A copy that joined a live execution or replayed a stored answer reached no backend and is
// charged nothing, but a bill shows it (successful calls, cost per call, duplicate ratio). A
// Tally counts them in each process and flushes one report per tenant every few seconds to
// OG_TALLY, a stream of its own; Bill reads the reports whose interval ends in its period. A
// crash loses at most the counts of the process's last interval (see Tally).
//
// # Concurrency
//
// A Ledger, a Budgets and a Tally are safe for concurrent use. Appends to one tenant are serialized in
// the process (a mutex per tenant) and across processes (the expected-sequence check). No
// method starts a goroutine that outlives it.
package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// StreamName is the ledger stream (of partition 0; partition k's is LEDGER_P<k>, see
// WithPartition).
const StreamName = "LEDGER"

// subjectPrefix starts every tenant subject; allSubjects matches them all (in partition 0;
// partition k's start with "p<k>.").
const (
	subjectPrefix = "ledger."
	allSubjects   = "ledger.>"
)

// DuplicateWindow is the stream's Nats-Msg-Id window. It is short on purpose: the server keeps
// every id of the window in memory (at 1,000 charges a second, an hour was ~3.6 M ids, hundreds
// of MB), and the window adds no protection beyond a few minutes. JetStream checks the
// expected last sequence before it, so it only acts on a publish whose head was current, and
// then the in-memory id index has seen every entry the window could name, as long as the
// dedup horizon is at least the window (the gateway's is 10 minutes). It covers a re-publish
// while an append's outcome is unknown.
const DuplicateWindow = 2 * time.Minute

// Entry kinds.
const (
	KindCharge       = "charge"
	KindContinuation = "continuation"
	KindReversal     = "reversal"
)

// ReasonDuplicate starts the reason of every reversal Reconcile appends.
const ReasonDuplicate = "duplicate"

// DefaultCurrency is used when New gets an empty currency.
const DefaultCurrency = "USD"

// Sentinel errors.
var (
	// ErrInvalid is returned for an input that cannot become an entry (empty tenant, a key hash
	// or job id that is not a plain token, negative tokens, a reversal of a reversal, ...).
	ErrInvalid = errors.New("ledger: invalid input")
	// ErrNoUsage is returned by Charge and Continuation when there is nothing to bill (zero
	// input and output tokens). Callers may ignore it.
	ErrNoUsage = errors.New("ledger: no billable usage")
	// ErrNotFound is returned when an entry id (a charge to reverse or continue) is unknown.
	ErrNotFound = errors.New("ledger: entry not found")
	// ErrFenced is returned when ChargeInput.Expect refused: the writer lost its fencing token.
	ErrFenced = errors.New("ledger: fenced")
	// ErrContended is returned when an append lost the race for its tenant's chain too often.
	ErrContended = errors.New("ledger: chain contended")
	// ErrChainBroken is returned by Verify and Report.Err (as a *ChainError) when an entry was
	// altered, removed, inserted or reordered, or its chain recomputed without the secret.
	ErrChainBroken = errors.New("ledger: chain broken")
	// ErrUnchecked is returned by Verify and Report.Err when nothing else was found but keyed
	// entries (or a heads file's MAC) could not be checked: no secret was given.
	ErrUnchecked = errors.New("ledger: keyed entries not checked without the secret")
	// ErrAnchor is returned by Report.Err (as an *AnchorError) when the ledger does not match
	// its anchored heads: a tenant's chain was cut or rewritten, a tenant removed, or the heads
	// file altered.
	ErrAnchor = errors.New("ledger: chain does not match its anchor")
	// ErrCorrupt is returned when a stored message or an export line is not a ledger entry.
	ErrCorrupt = errors.New("ledger: corrupt entry")
	// ErrStreamConfig is returned by EnsureStream when an existing LEDGER stream cannot be
	// brought to the ledger's protections (memory storage, a mirror, ...).
	ErrStreamConfig = errors.New("ledger: stream configuration")
	// ErrBudgetExceeded is returned by Budgets.Reserve and Admit (as a *BudgetError) when
	// admitting the request could take the tenant over its limit.
	ErrBudgetExceeded = errors.New("ledger: budget exceeded")
	// ErrBudgetNoFit is the ErrBudgetExceeded (a *BudgetError matches both) of a tenant whose
	// spend is below its limit: the request's estimate does not fit in what remains, less what
	// is in flight. A request with a lower max_tokens may fit.
	ErrBudgetNoFit = errors.New("ledger: the request's estimate does not fit in the budget's remainder")
	// ErrCurrencyMismatch is returned by Bill when the entries are in more than one currency.
	ErrCurrencyMismatch = errors.New("ledger: mixed currencies")
)

// Log field names.
const (
	fieldTenant  = "tenant"
	fieldKeyHash = "idem_key_hash"
	fieldJobID   = "job_id"
	fieldEntryID = "ledger_id"
	fieldSeq     = "seq"
	fieldModel   = "model"
	fieldKind    = "kind"
	fieldCost    = "cost_micros"
	// fieldPartition is on every log line of a ledger of partition k ≥ 1.
	fieldPartition = "partition"
)

// Entry is one ledger entry. CostMicros is always ≥ 0; its sign comes from Kind (a reversal
// subtracts). A reversal copies the reversed entry's tenant, intent, model, backend, tokens and
// cost, so a bill can be computed from the entries of its period alone.
type Entry struct {
	ID           string    `json:"id"`
	Kind         string    `json:"kind"`
	Tenant       string    `json:"tenant"`
	KeyHash      string    `json:"key_hash"`
	JobID        string    `json:"job_id"`
	Epoch        int       `json:"epoch"`
	Attempt      int       `json:"attempt"`
	Model        string    `json:"model"`
	Backend      string    `json:"backend"`
	InputTokens  int       `json:"input_tokens"`
	OutputTokens int       `json:"output_tokens"`
	Estimated    bool      `json:"estimated"`
	Completed    bool      `json:"completed"`
	CostMicros   int64     `json:"cost_micros"`
	Currency     string    `json:"currency"`
	Refers       string    `json:"refers"`
	Reason       string    `json:"reason"`
	Time         time.Time `json:"time"`
	Fence        uint64    `json:"fence"`
	PrevHash     string    `json:"prev_hash"`
	Hash         string    `json:"hash"`
	// Seq is the entry's stream sequence (not covered by the hash: the stream assigns it).
	Seq uint64 `json:"seq"`
}

// Signed is the entry's effect on a balance: +cost for a charge or continuation, -cost for a
// reversal.
func (e *Entry) Signed() int64 {
	if e.Kind == KindReversal {
		return -e.CostMicros
	}
	return e.CostMicros
}

// Price of a model in micro-units of the ledger's currency per million tokens.
type Price struct {
	InputPerMillion  int64 `json:"input_per_million" yaml:"input_per_million"`
	OutputPerMillion int64 `json:"output_per_million" yaml:"output_per_million"`
}

// Prices maps a model name to its price; the key "*" prices every model not listed.
type Prices map[string]Price

// Lookup returns the price of model (or of "*"), and whether there is one.
func (p Prices) Lookup(model string) (Price, bool) {
	if pr, ok := p[model]; ok {
		return pr, true
	}
	pr, ok := p["*"]
	return pr, ok
}

// Cost is the price of in input and out output tokens of model, in micro-units, rounded half
// up (0 for an unpriced model or negative counts). It cannot overflow: the products are
// computed on 128 bits, and a result beyond int64 saturates.
func (p Prices) Cost(model string, in, out int) int64 {
	pr, ok := p.Lookup(model)
	if !ok {
		return 0
	}
	hi1, lo1 := mulNonNeg(in, pr.InputPerMillion)
	hi2, lo2 := mulNonNeg(out, pr.OutputPerMillion)
	lo, carry := bits.Add64(lo1, lo2, 0)
	hi, _ := bits.Add64(hi1, hi2, carry)
	lo, carry = bits.Add64(lo, 500_000, 0) // round half up
	hi += carry
	if hi >= 1_000_000 {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, 1_000_000)
	if q > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(q)
}

func mulNonNeg(n int, price int64) (hi, lo uint64) {
	if n <= 0 || price <= 0 {
		return 0, 0
	}
	return bits.Mul64(uint64(n), uint64(price))
}

// EstimateTokens estimates the tokens of text that a backend did not count: one token per four
// bytes, rounded up (the usual rule of thumb for English and JSON). Charges built from it must
// set Estimated.
func EstimateTokens(text []byte) int { return (len(text) + 3) / 4 }

// Subject is the ledger subject of tenant: a hash, never the tenant's text.
func Subject(tenant string) string {
	sum := sha256.Sum256([]byte("oncegate-ledger-tenant\x00" + tenant))
	return subjectPrefix + hex.EncodeToString(sum[:16])
}

// Option configures a Ledger.
type Option func(*Ledger)

// WithLogger sets the logger (default: none).
func WithLogger(log zerolog.Logger) Option {
	return func(l *Ledger) { l.log = log.With().Str("component", "ledger").Logger() }
}

// WithDedupHorizon bounds the in-memory index of entry ids an append checks first (default 0:
// the tenant's whole history, loaded on first use). With a horizon a process's first append
// to a tenant reads only the entries stored within it instead of the tenant's whole history
// (which, tenants being interleaved in the stream, costs a read of the whole stream), and the
// index holds one horizon of ids (~90 B each). An append that may repeat an older entry says
// so with ChargeInput.After, and is then looked up in the stream from that time: the horizon
// can be minutes. Reversals stay idempotent at any age: Reverse and Reconcile look older
// entries up.
func WithDedupHorizon(d time.Duration) Option { return func(l *Ledger) { l.horizon = d } }

// WithMetrics counts the entries this ledger appends (oncegate_spend_micros_total,
// oncegate_ledger_reversals_total) and the duplicate executions Reconcile finds.
func WithMetrics(m *telemetry.Metrics) Option { return func(l *Ledger) { l.metrics = m } }

// WithSecret keys the chain: every entry this ledger appends is hashed with KeyedHashOf under
// secret (at least MinSecretLen bytes; CheckSecret; a shorter one panics in New), so nobody
// without the secret can recompute the chain after an edit. Entries appended before, unkeyed,
// still verify; a chain may mix both, unkeyed entries first. Keep the secret configured once it
// is: an unkeyed entry after a keyed one is what a recomputation without the key looks like,
// and Check reports it. Nil or empty: unkeyed (SHA-256).
func WithSecret(secret []byte) Option {
	return func(l *Ledger) {
		if len(secret) == 0 {
			l.secret = nil
			return
		}
		if err := CheckSecret(secret); err != nil {
			panic(err.Error())
		}
		l.secret = bytes.Clone(secret)
	}
}

// WithReconcileHorizon bounds Reconcile's in-memory summary (default 0: every intent read):
// an intent charged once is forgotten once its charge is older than d. Set it to at least the
// idempotency record TTL: the charges of one intent all come from the epochs of one job,
// while its record exists.
func WithReconcileHorizon(d time.Duration) Option {
	return func(l *Ledger) { l.reconcileHorizon = d }
}

// DefaultReconcileLimit is the most intents Reconcile's summary keeps (about 100 bytes each:
// 100 MiB) when it has a horizon. A horizon alone bounds the summary by time, which at a high
// rate and a long record TTL is still unbounded in size (1,000 intents/s over a 48 h horizon
// are 17 GB).
const DefaultReconcileLimit = 1 << 20

// WithReconcileLimit bounds Reconcile's summary by size, when it has a horizon (default
// DefaultReconcileLimit; 0: no bound): past n intents, the intents charged once whose charges
// are the oldest are forgotten before the horizon, down to 7/8 of n, and the report and the
// log say so. A second charge of such an intent is then not reversed; one comes from a
// takeover of the same job, minutes after the first, far inside what 7/8 of n intents span.
func WithReconcileLimit(n int) Option {
	return func(l *Ledger) { l.reconcileLimit = n }
}

// WithPartition binds the ledger to partition p (default 0): its stream is p.Stream(StreamName)
// (LEDGER, LEDGER_P1, ...) and its subjects p.Subject of the tenant subjects (ledger.<hash>,
// p1.ledger.<hash>, ...). Each partition's stream holds its own chain per tenant. The ledger
// refuses an entry whose key hash belongs to another partition (partition.OfKey): an intent
// and all its charges live in the partition of its key. A Set holds one per partition.
func WithPartition(p partition.P) Option { return func(l *Ledger) { l.part = p } }

// WithClock sets the clock that stamps entries (default time.Now).
func WithClock(now func() time.Time) Option { return func(l *Ledger) { l.now = now } }

// Ledger appends to and reads from the LEDGER stream of its partition (WithPartition). Create
// the stream with EnsureStream (EnsurePartition) first.
type Ledger struct {
	// part is the ledger's partition; streamName, prefix and all its stream, the prefix of
	// its tenant subjects and the filter of them all.
	part       partition.P
	streamName string
	all        string
	// scans counts reads of a chain's entries from the stream (tests).
	scans atomic.Int64
	// batches counts the atomic batches appended (tests).
	batches atomic.Int64
	// refused counts publishes refused for a stale head (tests).
	refused atomic.Int64
	// leads says whether this process's server leads a stream (WithLeaderCheck); serving is
	// set while ServeAppends serves this ledger's appends; forwardWait bounds a forward.
	leads       func(stream string) bool
	serving     atomic.Bool
	forwardWait time.Duration
	// noAtomic is set once LEDGER refused an atomic batch as disabled.
	noAtomic atomic.Bool
	js       jetstream.JetStream
	prices   Prices
	currency string
	log      zerolog.Logger
	now      func() time.Time
	horizon  time.Duration
	// reconcileHorizon bounds Reconcile's summary (WithReconcileHorizon).
	reconcileHorizon time.Duration
	// reconcileLimit bounds it by size (WithReconcileLimit).
	reconcileLimit int

	mu     sync.Mutex
	st     jetstream.Stream
	chains map[string]*chain // by tenant
	recon  *reconState
	// unpriced are the models already warned about (at most maxUnpricedWarnings).
	unpriced map[string]bool
	// metrics counts the entries appended (spend, reversals) and the duplicates found; nil: none.
	metrics *telemetry.Metrics
	// secret keys the chain (WithSecret); nil: unkeyed.
	secret []byte
}

// maxUnpricedWarnings bounds the models an unpriced-model warning is given for (model names
// come from requests when a catch-all backend serves them).
const maxUnpricedWarnings = 1024

// New returns a Ledger on js pricing charges from prices in currency (DefaultCurrency if
// empty). The prices map is read, never written; do not change it afterwards.
func New(js jetstream.JetStream, prices Prices, currency string, opts ...Option) *Ledger {
	if currency == "" {
		currency = DefaultCurrency
	}
	l := &Ledger{js: js, prices: prices, currency: currency, log: zerolog.Nop(), now: time.Now, chains: map[string]*chain{},
		reconcileLimit: DefaultReconcileLimit, forwardWait: forwardWait}
	for _, o := range opts {
		o(l)
	}
	l.streamName, l.all = l.part.Stream(StreamName), l.part.Subject(allSubjects)
	if l.part != 0 {
		l.log = l.log.With().Int(fieldPartition, int(l.part)).Logger()
	}
	return l
}

// Partition is the ledger's partition (WithPartition).
func (l *Ledger) Partition() partition.P { return l.part }

// Stream is the name of the ledger's stream: LEDGER in partition 0, LEDGER_P<k> in k.
func (l *Ledger) Stream() string { return l.streamName }

// subject is tenant's subject in the ledger's partition.
func (l *Ledger) subject(tenant string) string { return l.part.Subject(Subject(tenant)) }

// Currency is the currency of the ledger's charges.
func (l *Ledger) Currency() string { return l.currency }

// Prices is the ledger's price table (do not modify it).
func (l *Ledger) Prices() Prices { return l.prices }

// stream returns the LEDGER stream handle; (nil, nil) if the stream does not exist.
func (l *Ledger) stream(ctx context.Context) (jetstream.Stream, error) {
	l.mu.Lock()
	st := l.st
	l.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := l.js.Stream(ctx, l.streamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: stream %s: %w", l.streamName, err)
	}
	l.mu.Lock()
	l.st = st
	l.mu.Unlock()
	return st, nil
}

// ChargeInput is the usage of one backend execution (Charge) or of one stream continuation
// (Continuation, where Attempt numbers the continuation).
type ChargeInput struct {
	Tenant       string
	KeyHash      string // the idempotency record key (a hash)
	JobID        string
	Epoch        int
	Attempt      int
	Model        string
	Backend      string
	InputTokens  int
	OutputTokens int
	// Estimated: the backend reported no usage and the tokens were counted by the gateway.
	Estimated bool
	// Completed: this execution's record reached COMPLETED (the writer's compare-and-set
	// succeeded). Reconcile keeps a completed charge over the others of its intent.
	Completed bool
	// Fence is the idempotency record revision the writer held.
	Fence uint64
	// Expect, when set, re-checks the writer's fencing token before every publish attempt; an
	// error stops the append with ErrFenced.
	Expect func(ctx context.Context) error
	// After, when set, says this charge may repeat one appended before (a redelivered job
	// whose outcome was stored, and maybe charged, by a worker that then vanished), and that
	// such an entry was stored after After (say, when the outcome was stored). An id that is
	// not in the in-memory index is then looked up among the tenant's entries stored since
	// After (less a minute for clocks) before anything is published, however old they are.
	After time.Time
}

// token reports whether s is a plain id token: 1-128 of [A-Za-z0-9_-].
func token(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (c *ChargeInput) validate() error {
	switch {
	case c.Tenant == "":
		return fmt.Errorf("%w: empty tenant", ErrInvalid)
	case !token(c.KeyHash):
		return fmt.Errorf("%w: key hash is not a plain token", ErrInvalid)
	case !token(c.JobID):
		return fmt.Errorf("%w: job id is not a plain token", ErrInvalid)
	case c.Epoch < 1:
		return fmt.Errorf("%w: epoch %d < 1", ErrInvalid, c.Epoch)
	case c.Attempt < 0:
		return fmt.Errorf("%w: attempt %d < 0", ErrInvalid, c.Attempt)
	case c.Model == "":
		return fmt.Errorf("%w: empty model", ErrInvalid)
	case c.InputTokens < 0 || c.OutputTokens < 0:
		return fmt.Errorf("%w: negative tokens", ErrInvalid)
	case c.InputTokens == 0 && c.OutputTokens == 0:
		return ErrNoUsage
	}
	return nil
}

// ChargeID is the id of the charge of execution (keyHash, jobID, epoch, attempt).
func ChargeID(keyHash, jobID string, epoch, attempt int) string {
	return KindCharge + "." + keyHash + "." + jobID + "." + strconv.Itoa(epoch) + "." + strconv.Itoa(attempt)
}

// ContinuationID is the id of continuation number attempt of execution (keyHash, jobID, epoch).
func ContinuationID(keyHash, jobID string, epoch, attempt int) string {
	return KindContinuation + "." + keyHash + "." + jobID + "." + strconv.Itoa(epoch) + "." + strconv.Itoa(attempt)
}

// ReversalID is the id of the reversal of entry id.
func ReversalID(id string) string { return KindReversal + "." + id }

// entryFrom builds the entry of c (without chain fields).
func (l *Ledger) entryFrom(kind, id string, c *ChargeInput) Entry {
	return Entry{ID: id, Kind: kind, Tenant: c.Tenant, KeyHash: c.KeyHash, JobID: c.JobID, Epoch: c.Epoch,
		Attempt: c.Attempt, Model: c.Model, Backend: c.Backend, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens,
		Estimated: c.Estimated, Completed: c.Completed, CostMicros: l.prices.Cost(c.Model, c.InputTokens, c.OutputTokens),
		Currency: l.currency, Time: l.now().UTC(), Fence: c.Fence}
}

// Charge appends the charge of one backend execution, priced from the ledger's table (an
// unpriced model is charged 0 and logged). It is idempotent: a charge whose id exists is
// returned as stored, not written again.
func (l *Ledger) Charge(ctx context.Context, c ChargeInput) (Entry, error) {
	if err := c.validate(); err != nil {
		return Entry{}, fmt.Errorf("ledger: charge: %w", err)
	}
	e := l.entryFrom(KindCharge, ChargeID(c.KeyHash, c.JobID, c.Epoch, c.Attempt), &c)
	l.warnUnpriced(&e)
	out, _, err := l.append(ctx, e, c.Expect, c.After)
	return out, err
}

// Continuation appends the usage of a stream continuation of charge chargeID (c.Attempt
// numbers the continuation). Tenant, KeyHash, JobID and Epoch may be left empty: they are taken
// from the charge; given, they must match it. Idempotent like Charge.
func (l *Ledger) Continuation(ctx context.Context, chargeID string, c ChargeInput) (Entry, error) {
	ch, err := l.find(ctx, c.Tenant, chargeID, c.After)
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: continuation of %s: %w", chargeID, err)
	}
	if ch.Kind != KindCharge {
		return Entry{}, fmt.Errorf("ledger: continuation of %s: %w: not a charge", chargeID, ErrInvalid)
	}
	fill := func(dst *string, v string) bool {
		if *dst == "" {
			*dst = v
		}
		return *dst == v
	}
	if !fill(&c.Tenant, ch.Tenant) || !fill(&c.KeyHash, ch.KeyHash) || !fill(&c.JobID, ch.JobID) {
		return Entry{}, fmt.Errorf("ledger: continuation of %s: %w: intent differs from the charge's", chargeID, ErrInvalid)
	}
	if c.Epoch == 0 {
		c.Epoch = ch.Epoch
	}
	if c.Epoch != ch.Epoch {
		return Entry{}, fmt.Errorf("ledger: continuation of %s: %w: epoch differs from the charge's", chargeID, ErrInvalid)
	}
	if c.Model == "" {
		c.Model = ch.Model
	}
	if err := c.validate(); err != nil {
		return Entry{}, fmt.Errorf("ledger: continuation of %s: %w", chargeID, err)
	}
	e := l.entryFrom(KindContinuation, ContinuationID(c.KeyHash, c.JobID, c.Epoch, c.Attempt), &c)
	e.Refers = chargeID
	l.warnUnpriced(&e)
	out, _, err := l.append(ctx, e, c.Expect, c.After)
	return out, err
}

// warnUnpriced warns once per model per process that it is charged 0 (a warning per request
// would flood the log of a gateway serving the unpriced built-in mock); repeats go to debug.
func (l *Ledger) warnUnpriced(e *Entry) {
	if _, ok := l.prices.Lookup(e.Model); ok {
		return
	}
	l.mu.Lock()
	first := !l.unpriced[e.Model] && len(l.unpriced) < maxUnpricedWarnings
	if first {
		if l.unpriced == nil {
			l.unpriced = map[string]bool{}
		}
		l.unpriced[e.Model] = true
	}
	l.mu.Unlock()
	ev := l.log.Debug()
	if first {
		ev = l.log.Warn()
	}
	ev.Str(fieldEntryID, e.ID).Str(fieldTenant, e.Tenant).Str(fieldModel, e.Model).
		Msg("model has no price: charged 0; add it to the price table")
}

// Reverse appends the reversal of a charge or continuation. It is idempotent (one reversal per
// entry, id ReversalID(id)): reversing twice returns the first reversal.
func (l *Ledger) Reverse(ctx context.Context, id, reason string) (Entry, error) {
	e, err := l.find(ctx, "", id, time.Time{})
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: reverse %s: %w", id, err)
	}
	out, _, err := l.reverse(ctx, &e, reason, false)
	return out, err
}

// reverse appends the reversal of e; created reports whether it was new. unseen says the
// caller read the ledger up to a point where e had no reversal (Reconcile): only newer entries,
// within the dedup horizon, can hold it.
func (l *Ledger) reverse(ctx context.Context, e *Entry, reason string, unseen bool) (Entry, bool, error) {
	if e.Kind != KindCharge && e.Kind != KindContinuation {
		return Entry{}, false, fmt.Errorf("ledger: reverse %s: %w: a %s cannot be reversed", e.ID, ErrInvalid, e.Kind)
	}
	r := *e
	r.ID, r.Kind, r.Refers, r.Reason = ReversalID(e.ID), KindReversal, e.ID, reason
	r.Time, r.Fence, r.Completed = l.now().UTC(), 0, false
	r.PrevHash, r.Hash, r.Seq = "", "", 0
	if unseen {
		return l.append(ctx, r, nil, time.Time{})
	}
	// A reversal may come long after the charge: look beyond the dedup horizon for it.
	seq, found, err := l.chain(r.Tenant).lookup(ctx, l, r.ID, time.Time{})
	if err != nil {
		return Entry{}, false, fmt.Errorf("ledger: reverse %s: %w", e.ID, err)
	}
	if found {
		prev, err := l.entryAt(ctx, seq)
		return prev, false, err
	}
	return l.append(ctx, r, nil, time.Time{})
}

// find returns the entry id; tenant narrows the search ("" searches every tenant: the chains
// this process holds, then the whole stream). A non-zero after says the entry was stored after
// it, so a tenant's entries are read from there rather than from the start.
func (l *Ledger) find(ctx context.Context, tenant, id string, after time.Time) (Entry, error) {
	if tenant != "" {
		seq, ok, err := l.chain(tenant).lookup(ctx, l, id, after)
		if err != nil {
			return Entry{}, err
		}
		if !ok {
			return Entry{}, ErrNotFound
		}
		return l.entryAt(ctx, seq)
	}
	l.mu.Lock()
	chains := make([]*chain, 0, len(l.chains))
	for _, c := range l.chains {
		chains = append(chains, c)
	}
	l.mu.Unlock()
	for _, c := range chains {
		c.mu.Lock()
		seq, ok := uint64(0), false
		if c.loaded {
			seq, ok = c.ids[digest(id)]
		}
		c.mu.Unlock()
		if ok {
			return l.entryAt(ctx, seq)
		}
	}
	var found *Entry
	errStop := errors.New("stop")
	err := l.scan(ctx, l.all, span{}, func(e *Entry) error {
		if e.ID == id {
			found = e
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return Entry{}, err
	}
	if found == nil {
		return Entry{}, ErrNotFound
	}
	return *found, nil
}

// counted counts an entry this ledger appended: a charge or continuation is spend, a
// reversal is counted apart (a counter never goes down; net spend is spend minus reversals'
// cost, which the bills say).
func (l *Ledger) counted(e *Entry) {
	switch e.Kind {
	case KindCharge, KindContinuation:
		l.metrics.Spend(e.Tenant, e.Model, e.CostMicros)
	case KindReversal:
		l.metrics.Reversal(e.Tenant)
	}
}
