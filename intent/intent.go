package intent

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

// Outcome is what a request was attached to (the Oncegate-Idempotency header).
type Outcome string

// Outcomes of Admit. A conflict (ErrKeyReused, ErrKeyForeign) or a refusal (the budget,
// ErrContended) is an error instead.
const (
	Created  Outcome = "created"  // a new execution, this request's own
	Joined   Outcome = "joined"   // a live execution of the same intent
	Replayed Outcome = "replayed" // the stored outcome of the same intent
	Bypassed Outcome = "bypassed" // an execution of its own, deduplication off
)

// Sentinel errors. httpapi maps each to a status and a provider-format body in one table.
var (
	// ErrKeyReused: the key's record holds another request body (422, never the old answer).
	ErrKeyReused = errors.New("intent: this Idempotency-Key was already used with a different request body")
	// ErrKeyForeign: the key names another tenant's record (only a crafted "auto-" key can);
	// it answers as a reused key, saying nothing of the other tenant.
	ErrKeyForeign = errors.New("intent: this Idempotency-Key was used with a different request")
	// ErrContended: the record changed under every one of Admit's attempts to decide.
	ErrContended = errors.New("intent: the idempotency key is contended; retry")
	// ErrHistoryLost: a follower joined too late for the execution's early output, which the
	// chunk stream no longer holds; once it has finished, its record answers.
	ErrHistoryLost = errors.New("intent: this execution's early output is no longer retained; retry once it has finished")
	// ErrInterrupted: the execution was fenced or its feed ended, and its record could not be
	// read or followed again.
	ErrInterrupted = errors.New("intent: the execution was interrupted; retry")
	// ErrNoJob: no job of this tenant has this id (malformed, unknown, expired or foreign:
	// the same answer, so an id says nothing about other tenants).
	ErrNoJob = errors.New("intent: no such job")
	// ErrNoRecord: no record of this tenant for this Idempotency-Key.
	ErrNoRecord = errors.New("intent: no record for this Idempotency-Key")
	// ErrJobChanging: Cancel lost the compare-and-set on every attempt.
	ErrJobChanging = errors.New("intent: the job is changing; retry")
	// ErrOverloaded: a new execution was refused by the node's admission bounds (executions
	// in flight here, or the job queue's wait); nothing was written, so a retry is safe.
	// Copies of existing intents are never refused by them.
	ErrOverloaded = errors.New("intent: the gateway is at capacity")
)

// Budgeter admits new executions against tenants' spend limits (replays and joins never
// reach it): ledger.TenantBudgets. Admit returns ledger.ErrBudgetExceeded when the request's
// estimate does not fit under the tenant's limit (also ledger.ErrBudgetNoFit while the spend
// is below it).
type Budgeter interface {
	// Admit reserves the estimate of ask, an execution of job ask.JobID (its settle hold names
	// it: the ledger's charge of the job supersedes it), and returns what it reserved.
	Admit(ctx context.Context, tenant string, ask ledger.Ask) (reserved int64, release func(actualMicros int64), err error)
}

// Options are the idempotency settings the core decides with.
type Options struct {
	// Lease is a new PENDING record's lease (renewed by its worker).
	Lease time.Duration
	// StoreWait is how long Admit waits for an unavailable store before it refuses a request
	// whose client stated no timeout (jsretry.ErrUnavailable: 503); 0: jsretry.Window.
	// StoreWaitMax bounds the wait a client's stated timeout asks for (Request.ClientTimeout);
	// 0: StoreWait.
	StoreWait, StoreWaitMax time.Duration
	// TTL is how long a finished record is kept; the replay cache keeps no entry longer.
	TTL time.Duration
	// AutoWindow: an identical request without a key, sent later than this after the first
	// (and not declaring itself a retry), is a new intent.
	AutoWindow time.Duration
	// ReplayCacheBytes bounds the node's cache of final records (0: no cache).
	ReplayCacheBytes int64
	// DefaultMaxTokens is the output estimate of a request that sets no max_tokens: for the
	// tenant's tokens per minute, and for its budget while the model's recent answers are too
	// few to estimate from (ledger.Budgets.Admit).
	DefaultMaxTokens int
	// MaxExecutions bounds the new executions this node admitted and has not answered yet
	// (0: no bound); beyond it a new intent gets ErrOverloaded. A background job holds its
	// place only until it is submitted.
	MaxExecutions int
	// MaxQueueWait bounds the wait of the job at the head of the JOBS queue (Deps.Queue); while
	// it is over, a new intent gets ErrOverloaded (0: no bound).
	MaxQueueWait time.Duration
	// MaxBodyBytesInFlight bounds the request-body bytes of the new executions this node
	// admitted and has not answered (0: no bound); beyond it a new intent gets ErrOverloaded.
	// Each body is held a few times over (the record, the job, the worker's and backend's
	// copies), so this bounds what a burst of large requests costs in memory.
	MaxBodyBytesInFlight int64
	// Limits are the tenants' caps on this node (its share of each; limits.go); a tenant
	// without an entry has none.
	Limits map[string]Limits
}

// Deps is what the core needs.
type Deps struct {
	JS jetstream.JetStream
	// Store and Hub are partition 0's records and executions; Partitions, when set, are every
	// partition's, in order (Store and Hub are then ignored).
	Store      *kv.Store
	Hub        *jobs.Hub
	Partitions []Partition
	// Budgets enables spend limits; nil admits every execution.
	Budgets Budgeter
	Prices  ledger.Prices
	Options Options
	Log     zerolog.Logger
	// Metrics counts the decisions (budget refusals, takeovers, replay-cache hits, executions
	// avoided); nil counts nothing.
	Metrics *telemetry.Metrics
	// Tally keeps the executions avoided for the bills (a ledger.Tally); nil keeps none.
	Tally AvoidedCounter
	// Queue tells how long the job at the head of the JOBS queue has waited (jobs.QueueWatch),
	// for Options.MaxQueueWait; nil: not bounded.
	Queue QueueWaiter
	// Local runs a bypassed request's execution in this process (workers.Pool.RunLocal); nil
	// (a node without workers) sends every execution through JOBS.
	Local LocalRunner
	// Hold reserves a slot of this node's workers for a new execution admitted here, which
	// then runs here as a held job (jobs.HeldMsg, workers.Pool.Hold) instead of going
	// through the JOBS queue; nil (a node without workers) queues every job.
	Hold Holder
	// CheckHolder asks, when a copy joins a held execution of another node or waits on it in
	// silence, whether its holder is still there (workers.Pool.CheckHolder); nil (a node
	// without workers): the holder's death is found by the sweeps of the nodes that have them.
	CheckHolder HolderChecker
	// Offer hands this node's workers the record, request included, of each job it submits
	// (workers.Pool.Offer); nil (a node without workers): they decode the job's message, and
	// read a request stored in REQUESTS from there.
	Offer Offerer
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Cold is partition 0's cold tier, with Store and Hub (nil: none; Partitions carry their
	// own).
	Cold ColdTier
}

// Partition is one partition's records (its IDEM copy), the hub that follows its executions
// (its CHUNKS copy) and its cold tier.
type Partition struct {
	Store *kv.Store
	Hub   *jobs.Hub
	// Cold is the partition's cold tier (issue 46; nil: every record stays hot for the TTL).
	Cold ColdTier
}

// LocalRunner runs an execution whose record is not stored, for the one client following
// out's feed, on this node; false when it cannot now (it started nothing).
type LocalRunner interface {
	RunLocal(job *jobs.Job, rec *kv.Record, out *jobs.LocalPublisher) bool
}

// Holder reserves a slot of this node's workers for a new execution of key admitted here;
// nil when none is free, or no pool of key's partition runs here.
type Holder interface {
	Hold(key string) HeldSlot
}

// HolderChecker checks at once, in the background, that the pool holding key's PENDING
// execution rec (kv.Record.Worker) is still there, and has the execution taken over if not.
type HolderChecker interface {
	CheckHolder(key string, rec *kv.Record)
}

// HeldSlot is a reserved worker slot. The claim names its Worker; then Run runs the held job
// m (jobs.HeldMsg), its claim stored at at, its notices going first to local (the hub that
// follows it here, nil for a stream), or Release gives the slot back: one of the two, once.
type HeldSlot interface {
	Worker() string
	Run(m *nats.Msg, at time.Time, local jobs.LocalNotices)
	Release()
}

// Offerer holds rec, the record of key's job for epoch as written at rev, for this node's
// worker that takes that job, until withdraw.
type Offerer interface {
	Offer(key string, epoch int, rev uint64, rec *kv.Record) (withdraw func())
}

// QueueWaiter reports the current wait of the job queue's head.
type QueueWaiter interface {
	Wait() time.Duration
}

// Core decides every intent's life on this node. It is safe for concurrent use; the replay
// cache and the live-join map are its own, and every goroutine it starts belongs to a
// follower the caller closes.
type Core struct {
	js jetstream.JetStream
	// parts are the partitions' stores and hubs, by partition (one: an unpartitioned store).
	parts    []Partition
	budgets  Budgeter
	prices   ledger.Prices
	opts     Options
	finished *finishedCache // nil: off
	live     *liveKeys
	log      zerolog.Logger
	metrics  *telemetry.Metrics
	tally    AvoidedCounter
	// followers counts each live execution's copies on this node; nil without metrics.
	followers *followers
	queue     QueueWaiter
	local     LocalRunner // nil: no workers here
	offer     Offerer     // nil: no workers here
	holder    Holder      // nil: no workers here
	checker   HolderChecker
	// executions counts the new executions admitted here and not answered (MaxExecutions).
	executions atomic.Int64
	// bodyBytes sums their request bodies (MaxBodyBytesInFlight).
	bodyBytes atomic.Int64
	// limits are the tenants' caps (read-only map; the counters inside are atomic).
	limits map[string]*tenantLimits
	// refused are the admissions refused here whose write may still land (RunRefusals).
	refused refusals
	now     func() time.Time
}

// New builds the core.
func New(d Deps) *Core {
	c := &Core{js: d.JS, parts: d.Partitions, budgets: d.Budgets, prices: d.Prices, opts: d.Options,
		live: newLiveKeys(), log: d.Log, metrics: d.Metrics, tally: d.Tally, queue: d.Queue, local: d.Local, offer: d.Offer, holder: d.Hold, checker: d.CheckHolder, now: d.Now,
		limits: newTenantLimits(d.Options.Limits)}
	if c.now == nil {
		c.now = time.Now
	}
	if len(c.parts) == 0 {
		c.parts = []Partition{{Store: d.Store, Hub: d.Hub, Cold: d.Cold}}
	}
	if d.Metrics != nil || capsFollowers(c.limits) {
		c.followers = newFollowers()
	}
	if d.Options.ReplayCacheBytes > 0 {
		c.finished = newFinishedCache(d.Options.ReplayCacheBytes)
	}
	return c
}

// Request is an owned copy of everything admission needs (nothing in it is borrowed from an
// HTTP framework's reused memory).
type Request struct {
	Tenant string
	// Key is the record key (RecordKey or AutoKey); empty for a bypass, which gets a record
	// of its own per execution.
	Key         string
	Fingerprint string
	// Auto: Key was derived from the content (no Idempotency-Key was sent).
	Auto bool
	// Retry: the request declares itself a retry of an earlier attempt (an SDK's retry
	// header), so an auto key joins even outside AutoWindow.
	Retry bool
	// RetryHeader is the header that says which attempt the request is (SDKRetryHeader, or
	// one of idempotency.retry_headers), if one was sent: the rule a copy found by it is
	// reported with (Dedup).
	RetryHeader string
	// Arrived is when the request reached the gateway (zero: when it is admitted). An auto
	// key's window is judged from it, never from when the store answered: a claim that stalls
	// in an election is still the copy of the intent it arrived beside.
	Arrived time.Time
	// Bypass: deduplication is off for this request (X-Allow-Duplicate, or the route).
	Bypass bool
	// ContentKey is the auto key of a bypassed request whose client sent an SDK's retry
	// count (it retries on a timeout): its execution is listed under it, and its retry (Retry)
	// joins that execution (bypass.go). Empty: a bypass nothing will look for.
	ContentKey string
	// Async: the request is a background job (indexed as such; nobody follows it here).
	Async    bool
	Model    string
	API      string // the wire format: "openai", "anthropic", "embeddings" or "passthrough"
	Path     string // a passthrough request's path below the backend's base URL
	Backends []string
	Degraded *Degraded
	Header   map[string][]string // passed through to the backend
	Deadline time.Time           // the client's overall deadline (zero: none)
	// ClientTimeout is how long the client said it waits for this attempt (an official SDK's
	// X-Stainless-Timeout or x-stainless-read-timeout); 0: it did not say. Admission waits for
	// an unavailable store up to it, less a margin (Core.storeWait).
	ClientTimeout time.Duration
	TraceID       string // the request's W3C trace id, kept in a new record
	Stream        bool
	// MaxTokens is the request's output limit (0: not set), for the budget estimate.
	MaxTokens int
	Body      []byte
	// Retrievable: the job id is a handle the client keeps (a stored response): the job index
	// is written durably, as for an async job.
	Retrievable bool
	// Echo is kept in the record for the whole TTL (kv.Record.Echo); nil for most APIs.
	Echo []byte
}

// arrival is when req reached the gateway: Arrived, or now when it is not known (or later).
func (req *Request) arrival(now time.Time) time.Time {
	if req.Arrived.IsZero() || req.Arrived.After(now) {
		return now
	}
	return req.Arrived
}

// Degraded is the answer a route gives when none of its backends is healthy: a message, or
// a 503 that says when to retry.
type Degraded struct {
	Message    string
	RetryAfter int // seconds
}

// record is d as a record keeps it (nil: none).
func (d *Degraded) record() *kv.Degraded {
	if d == nil {
		return nil
	}
	return &kv.Degraded{Message: d.Message, RetryAfter: d.RetryAfter}
}

// Admission is the decision for one request: what it is attached to, and for a created,
// joined or bypassed one, the live feed of that execution's chunks.
type Admission struct {
	Outcome Outcome
	Key     string
	// Rec is the record the decision was made on; its Delivery replaces it when the
	// execution moves (a takeover) or ends.
	Rec   *kv.Record
	JobID string
	// Dedup says why a joined or replayed request was deduplicated; nil otherwise.
	Dedup *Dedup

	core   *Core
	fl     *jobs.Follower // created, joined, bypassed; nil for a replay
	settle func()         // ends a new execution's budget reservation; nil otherwise
	// redriven: a joined request whose admission took the lapsed execution over (it runs again)
	redriven bool
	// local: a bypass run on this node with no record (Core.runLocal): its feed is all there is
	local bool
	leave func()    // leaves the execution's follower count and the tenant's streams (Done); nil when not counted
	d     *Delivery // the delivery of fl (Delivery); ended by Close
	// withdraw ends the offer of the job's record to this node's workers (Close).
	withdraw func()
}

// Follower is the live feed of the execution; nil for a replay (answer from Rec).
func (a *Admission) Follower() *jobs.Follower { return a.fl }

// Local reports whether the execution runs on this node with no record (a bypass run where it
// was admitted): its feed is all there is, and nothing of it can be read back.
func (a *Admission) Local() bool { return a.local }

// Close stops following the execution (the execution goes on for its other copies).
func (a *Admission) Close() {
	if a.fl != nil {
		a.fl.Close()
	}
	if a.withdraw != nil {
		a.withdraw()
	}
	if a.d != nil {
		a.d.stop()
	}
}

// Done settles the budget reservation of a new execution, if any, and leaves the execution's
// follower count; call it once the answer is delivered (the ledger's charge replaces the
// reservation).
func (a *Admission) Done() {
	if a.settle != nil {
		a.settle()
		a.settle = nil
	}
	if a.leave != nil {
		a.leave()
		a.leave = nil
	}
}

// Partitions is the count of partitions the core's store has: record keys are made for it
// (RecordKey, AutoKey, LookupKey).
func (c *Core) Partitions() int { return len(c.parts) }

// part is key's partition's store and hub. A key tagged with a partition this store does not
// have (only a client's "auto-p<k>-…" in a status lookup can be) is looked for in partition 0,
// where it is not found.
func (c *Core) part(key string) Partition {
	if p := int(partition.OfKey(key)); p < len(c.parts) {
		return c.parts[p]
	}
	return c.parts[0]
}

// storeOf and hubOf are key's partition's store and hub.
func (c *Core) storeOf(key string) *kv.Store { return c.part(key).Store }
func (c *Core) hubOf(key string) *jobs.Hub   { return c.part(key).Hub }

// newJobID is a new job id of key's partition (partition.ID), so the jobs API finds its
// record from the id alone.
func (c *Core) newJobID(key string) string { return c.jobIDIn(key, jobs.NewID()) }

// jobIDIn is id marked as a job of key's partition.
func (c *Core) jobIDIn(key, id string) string {
	return partition.ID(len(c.parts), id, partition.OfKey(key))
}
