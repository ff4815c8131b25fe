// Package workers pulls jobs from the JOBS work queue and executes them: it checks the job
// against its idempotency record (the fencing token), holds and renews the record's lease while
// the backend call runs, publishes the output as chunks, writes the outcome to the record, and
// only then publishes the terminal chunk and acks the job.
//
// A Pool owns every goroutine it starts; Run returns after all of them ended.
package workers

import (
	"context"
	"errors"
	"fmt"
	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/dialects"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/resilience"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/tracing"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// Board is where the pool posts its backends' health.
type Board interface {
	Post(ctx context.Context, worker string, v any) error
}

// ConsumerName is the durable pull consumer every worker shares.
const ConsumerName = "workers"

// Options configures a Pool.
type Options struct {
	// ID names this worker process in records and logs.
	ID string
	// Concurrency bounds the backend calls in flight.
	Concurrency int
	// Lease is how long a record stays ours without renewal; RenewEvery is the renewal period.
	Lease, RenewEvery time.Duration
	// ShutdownGrace bounds how long Run waits for in-flight jobs after its ctx ends.
	ShutdownGrace time.Duration
	// Backends by configured name.
	Backends map[string]Backend
	// Dialects name the API each backend type speaks; nil is every dialect the gateway has
	// (dialects.Registry).
	Dialects *dialect.Registry
	Log      zerolog.Logger
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
	// Board, when set, gets this pool's backend status every few seconds (the status API).
	Board Board
	// Ledger, when set, is charged for every execution that produced billable output.
	Ledger Ledger
	// Metrics counts attempts, retries, breaker changes, executions, takeovers, fenced writes,
	// failed renewals and redeliveries; nil counts nothing.
	Metrics *telemetry.Metrics
	// SweepEvery is how often the pool looks for PENDING records whose lease ran out with no
	// job left to redeliver (a JOBS message lost to a NATS restart) and re-drives them, and
	// for finished records whose charge a crash may have skipped; 0 means five seconds,
	// negative disables the sweeper.
	SweepEvery time.Duration
	// ChargeGrace is how long after a billable record was written the sweep makes sure of its
	// charge (its worker charges it at once; this is for a worker that died first), so every
	// billable record is charged within ChargeGrace + SweepEvery while a pool runs; 0 means
	// 30 seconds.
	ChargeGrace time.Duration
	// Running, when set, says whether the worker pool of that id runs (it posts to the status
	// board: status.Posts.Posting). The charge sweep leaves a billable record to the pool that
	// stored it while that pool runs: it charged the record at once, or sweeps it itself if
	// that failed. Without it every pool's sweep reads every billable record another pool
	// stored, on a cluster two record reads and ledger lookups per intent (issue 44).
	Running func(worker string) bool
	// DiscardChunksAfter is how long a finished execution's chunks stay in CHUNKS after its
	// terminal chunk (later copies answer from the record); 0 keeps them for the stream's
	// retention.
	DiscardChunksAfter time.Duration
	// ChunkLinger is the least time between two data chunks of one stream (0: none); what
	// arrives meanwhile is coalesced. The first chunk and the stream's end never wait.
	ChunkLinger time.Duration
	// Tracer exports an execution's spans when tracing is configured (nil: off; the request's
	// traceparent still reaches the backend).
	Tracer *tracing.Tracer
	// CaptureContent puts the request's messages and the answer's text on the execution's and
	// the attempt's spans (gen_ai.input.messages, gen_ai.output.messages): tracing.capture_content.
	CaptureContent bool
	// Partition is the partition whose jobs the pool takes (its JOBS copy); its store and
	// ledger must be that partition's. A gateway runs one pool per partition.
	Partition partition.P
	// Slots, when set, are the execution slots the pool shares with the node's other pools
	// (one per partition): Concurrency then bounds their sum, not each pool's.
	Slots chan struct{}
}

// Pool runs jobs.
type Pool struct {
	js     jetstream.JetStream
	store  *kv.Store
	opts   Options
	guards map[string]*guard // per backend; built once, read concurrently
	// dialects is opts.Dialects or the full table; read-only.
	dialects *dialect.Registry
	// discard removes finished executions' chunks; nil when DiscardChunksAfter is 0.
	discard *jobs.Discarder
	// leases finds expired leases for Sweep, reading only the records written since its last
	// sweep.
	leases *kv.LeaseWatch
	// offers are the records of the jobs this node's admissions submitted, for the worker
	// that takes the job (Offer).
	offers sync.Map // offerKey → *kv.Record
	// charged are the records this pool charged itself since the sweep last looked: the
	// charge sweep need not read them (chargesweep.go).
	chargedMu sync.Mutex
	charged   map[string]chargedAt
	// runningMu guards running: the keys whose execution this pool runs now (→ the epochs
	// it runs), so that the redelivery of a job it still works on (its in-progress acks failed
	// while JOBS was unavailable) is never taken over by the same pool, and so that it can
	// answer a taker elsewhere that the execution still runs (jobs.Running).
	runningMu sync.Mutex
	running   map[string][]int
	// inflight is the dashboard's view of this pool (inflight.go).
	inflight inflight
	// slots bound the executions in flight, jobs' and local ones' (Options.Concurrency).
	slots chan struct{}
	// localMu guards localCtx: the context of local executions while Run runs, nil before and
	// once it began to stop. localWG counts the local executions; Run waits for them.
	localMu  sync.Mutex
	localCtx context.Context
	localWG  sync.WaitGroup
	// holderChecks are the presence checks of other pools asked by CheckHolder.
	holderChecks holderChecks
	// testHookBeforeCharge, when set (tests), is called after a COMPLETED outcome was stored
	// and announced; true makes the worker stop there as if it died.
	testHookBeforeCharge func() bool
	// testHookBeforeAnnounce, when set (tests), is called after a COMPLETED outcome was stored
	// and before its terminal chunk; true makes the worker stop there as if it died.
	testHookBeforeAnnounce func() bool
	// noHeartbeat (tests): the pool's job messages are not kept in progress, as when its acks
	// are lost (a partition), so JOBS redelivers them after its ack wait.
	noHeartbeat bool
}

// New makes a Pool.
func New(js jetstream.JetStream, store *kv.Store, opts Options) *Pool {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 64
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 10 * time.Second
	}
	if opts.SweepEvery == 0 {
		opts.SweepEvery = 5 * time.Second
	}
	if opts.ChargeGrace == 0 {
		opts.ChargeGrace = 30 * time.Second
	}
	if opts.Dialects == nil {
		opts.Dialects = dialects.Registry()
	}
	p := &Pool{js: js, store: store, opts: opts, guards: map[string]*guard{}, leases: store.WatchLeases(),
		dialects: opts.Dialects, charged: map[string]chargedAt{}, running: map[string][]int{}, slots: make(chan struct{}, opts.Concurrency)}
	if opts.DiscardChunksAfter > 0 {
		p.discard = jobs.NewDiscarder(js, opts.DiscardChunksAfter, opts.Log)
	}
	for name, b := range opts.Backends {
		cfg := b.Config()
		p.guards[name] = &guard{
			budget: resilience.NewBudget(cfg.RetryBudget, 3, 10*time.Second, nil),
			breaker: resilience.NewBreaker(resilience.BreakerConfig{Name: name, FailureRate: cfg.Breaker.FailureRate,
				MinRequests: cfg.Breaker.MinRequests, Window: cfg.Breaker.Window.D(), OpenFor: cfg.Breaker.OpenFor.D(),
				Probes: cfg.Breaker.Probes, OnChange: breakerChanged(opts.Metrics, name)}, opts.Log),
		}
		opts.Metrics.Breaker(name, telemetry.BreakerClosed, false) // a new breaker is closed
	}
	return p
}

// Sibling is a pool for partition part's jobs on the same node (store and led are that
// partition's): it shares p's execution slots, so Concurrency bounds the node's executions
// in all partitions, and p's breakers and retry budgets, so a backend's health is one view per
// node. p alone posts the node's status to the board.
func (p *Pool) Sibling(store *kv.Store, part partition.P, led Ledger) *Pool {
	opts := p.opts
	opts.Partition, opts.Ledger, opts.Board = part, led, nil
	s := &Pool{js: p.js, store: store, opts: opts, guards: p.guards, leases: store.WatchLeases(),
		dialects: p.dialects, charged: map[string]chargedAt{}, running: map[string][]int{}, slots: p.slots}
	if opts.DiscardChunksAfter > 0 {
		s.discard = jobs.NewDiscarder(p.js, opts.DiscardChunksAfter, opts.Log)
	}
	return s
}

func (p *Pool) guard(name string) *guard { return p.guards[name] }

// BackendStatus is the health of one backend as this pool sees it.
type BackendStatus struct {
	Name     string                 `json:"name"`
	Breaker  string                 `json:"breaker"`
	Requests uint32                 `json:"window_requests"`
	Failures uint32                 `json:"window_failures"`
	Budget   resilience.BudgetStats `json:"retry_budget"`
}

// Status reports every backend's breaker and retry budget.
func (p *Pool) Status() []BackendStatus {
	out := make([]BackendStatus, 0, len(p.guards))
	for name, g := range p.guards {
		req, fail := g.breaker.Counts()
		out = append(out, BackendStatus{Name: name, Breaker: g.breaker.State(), Requests: req, Failures: fail, Budget: g.budget.Stats()})
	}
	slices.SortFunc(out, func(a, b BackendStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// pullExpiry bounds one pull request. A pull sent while JOBS and this consumer were gone (a
// NATS restart, until the gateway recreates them) is answered by nobody and re-sent only when
// it expires or its heartbeats (half of it) go missing: with the default 30 s, the first
// request after a restart waited 30 s for a worker; at 5 s, at most 5 s.
const pullExpiry = 5 * time.Second

// EnsureConsumer creates or updates the shared durable consumer on partition p's JOBS.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, p partition.P, lease time.Duration, maxAckPending int) (jetstream.Consumer, error) {
	c, err := js.CreateOrUpdateConsumer(ctx, jobs.JobsStreamOf(p), jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait(lease),
		MaxAckPending: maxAckPending,
		FilterSubject: jobs.JobsSubjectsOf(p),
	})
	if err != nil {
		return nil, fmt.Errorf("workers: ensure consumer: %w", err)
	}
	return c, nil
}

// Run consumes jobs until ctx ends, then waits up to ShutdownGrace for in-flight jobs before
// cancelling them (their leases lapse and another worker takes them over).
func (p *Pool) Run(ctx context.Context) error {
	cons, err := EnsureConsumer(ctx, p.js, p.opts.Partition, p.opts.Lease, p.opts.Concurrency*4)
	if err != nil {
		return err
	}
	// Answered until every execution here ended: a taker elsewhere asks before it takes one over.
	answer, err := jobs.AnswerRunning(p.js.Conn(), p.runsEpoch)
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	defer func() { _ = answer.Unsubscribe() }()
	// Answered while this process lives: a taker asks for it before the lease runs out.
	presence, err := jobs.AnswerPresence(p.js.Conn(), p.opts.ID)
	if err != nil {
		return fmt.Errorf("workers: presence: %w", err)
	}
	defer func() { _ = presence.Unsubscribe() }()
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()
	// Held and local executions may start from here on: once the consumer pulls, the node is
	// running every way a job can reach it.
	p.openLocal(jobCtx)
	var wg sync.WaitGroup
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			_ = m.Nak()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-p.slots }()
			p.handle(jobCtx, m)
		}()
	}, jetstream.PullMaxMessages(p.opts.Concurrency), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		p.closeLocal()
		cancelJobs() // their leases lapse; a sweep elsewhere takes them over
		p.localWG.Wait()
		return fmt.Errorf("workers: consume: %w", err)
	}
	sweepDone, postDone, discardDone, beatDone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(beatDone)
		p.heartbeatLoop(jobCtx) // until the last execution ended (jobCtx outlives ctx)
	}()
	go func() {
		defer close(discardDone)
		if p.discard != nil {
			p.discard.Run(ctx)
		}
	}()
	go func() {
		defer close(sweepDone)
		p.sweepLoop(ctx)
	}()
	go func() {
		defer close(postDone)
		p.postLoop(ctx)
	}()
	<-ctx.Done()
	p.closeLocal()
	<-sweepDone
	p.leases.Close(context.Background()) // the sweeps' consumer on the bucket
	<-postDone
	<-discardDone
	cc.Stop()
	<-cc.Closed()
	done := make(chan struct{})
	go func() { wg.Wait(); p.localWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(p.opts.ShutdownGrace):
		p.opts.Log.Warn().Msg("shutdown grace over; cancelling in-flight jobs")
		cancelJobs()
		<-done
	}
	cancelJobs()
	<-beatDone
	return nil
}

// freshJob is how young a first delivery must be for its worker to trust the record the job
// carries instead of reading it (see trustSent).
const freshJob = time.Second

// trustSent reports whether the record a job carries can stand for the stored one, saving a
// read on the path of every new intent. It can when the job is a first delivery younger than
// freshJob whose record's lease still runs (with a second to spare for clocks): no takeover can
// have moved the key to another epoch, since a takeover needs an expired lease, or a
// redelivery (ackWait after a first delivery) that found the owner gone. A cancel in
// that second is still caught, by the completion's compare-and-set (and the lease renewals),
// after the backend call instead of before it.
func trustSent(md *jetstream.MsgMetadata, sent *kv.Record, now time.Time) bool {
	return md != nil && md.NumDelivered == 1 && now.Sub(md.Timestamp) < freshJob && leaseHolds(sent, now)
}

// leaseHolds reports whether rec's lease runs past now with a second to spare for clocks:
// no takeover can move the key to another epoch before the execution's first renewal.
func leaseHolds(rec *kv.Record, now time.Time) bool {
	return rec.State == kv.Pending && now.Add(time.Second).Before(rec.LeaseUntil)
}

// handle runs one delivered job message.
func (p *Pool) handle(ctx context.Context, m jetstream.Msg) {
	wire, err := jobs.Decode(m.Headers(), m.Data())
	var sent *kv.Record // the record as the job was submitted (with its request, unless stored out)
	if err == nil {
		var ok bool
		if sent, ok = p.offered(wire.Key, wire.Epoch, wire.Rev); !ok {
			sent, err = kv.Decode(wire.Record)
		}
	}
	if err == nil && wire.Request != nil {
		sent.Request = wire.Request // a version-3 job: stored out of the record, sent beside it
	}
	if err != nil {
		p.opts.Log.Error().Err(err).Msg("terminating undecodable job")
		_ = m.Term()
		return
	}
	log := p.opts.Log.With().Str(fieldJobID, wire.ID).Str(fieldKey, wire.Key).Int(fieldEpoch, wire.Epoch).Logger()
	rec, rev := sent, wire.Rev
	md, mdErr := m.Metadata()
	if mdErr == nil && md.NumDelivered > 1 {
		p.opts.Metrics.Redelivered()
	}
	free, waited := p.keyFree(ctx, wire.Key)
	if !free {
		// This pool runs the key now (also a job delivered again as new: see deliveredAgain),
		// maybe still writing its outcome: asked again once that is done.
		_ = m.NakWithDelay(time.Second)
		return
	}
	// After a wait for the key, the record the job carries is no longer to be trusted: the
	// execution that ended may have finished this very epoch.
	trusted := !waited && mdErr == nil && trustSent(md, sent, time.Now())
	if !trusted {
		// From the leader: a replica that has not caught up (a restarted node's) may still
		// show PENDING an execution that finished, and this job would run it again.
		rec, rev, err = p.store.Latest(ctx, wire.Key)
		switch {
		case errors.Is(err, kv.ErrNotFound):
			log.Info().Msg("record gone; dropping job")
			_ = m.Ack()
			return
		case err != nil:
			log.Warn().Err(err).Msg("reading record; will retry")
			_ = m.NakWithDelay(time.Second)
			return
		}
		if rec.RequestAt > 0 && rec.RequestAt == sent.RequestAt && len(rec.Request) == 0 {
			rec = rec.WithRequest(sent.Request) // stored in REQUESTS: the job carries the same bytes
		}
	}
	if rec.JobID != wire.ID || rec.Epoch != wire.Epoch || rec.State != kv.Pending || rec.Cancelled {
		if rec.JobID == wire.ID && rec.Epoch >= wire.Epoch && rec.State != kv.Pending {
			// Finished, but not acked: its worker may have died before charging or before
			// writing the terminal chunk — also a taker's, which ran a later epoch from this
			// same message. Both are idempotent, so make sure.
			p.charge(ctx, wire.Key, rec, rev, sent.Request, true)
			if !p.announce(ctx, wire.Key, rec, log) {
				_ = m.NakWithDelay(time.Second)
				return
			}
			p.dropRequest(wire.Key, rec, log)
		}
		log.Debug().Str("state", string(rec.State)).Int("record_epoch", rec.Epoch).Msg("stale job; dropping")
		_ = m.Ack()
		return
	}
	if rec.RequestAt > 0 && len(rec.Request) == 0 && (mdErr != nil || md.NumDelivered == 1) {
		// Stored in REQUESTS (a redelivery's takeover reads it, once it knows it takes over).
		var ok bool
		if rec, ok = p.storedRequest(ctx, wire.Key, rec, rev, m, log); !ok {
			return
		}
	}
	if !trusted && (mdErr != nil || md.NumDelivered == 1) && p.deliveredAgain(ctx, wire.Key, rec, log) {
		_ = m.NakWithDelay(ackWait(p.opts.Lease))
		return
	}
	job := intent.JobOf(wire.Key, rec)
	if now := p.opts.Now(); (mdErr != nil || md.NumDelivered == 1) && !leaseHolds(rec, now) {
		// A first delivery whose lease has run out: its submit landed late (a partition held
		// it past the lease), so a taker may be moving the key to a new epoch right now, this
		// pool's own sweep among them (it found nothing running: this execution had not
		// started). The epoch is claimed by compare-and-set before the backend is called, so
		// either this write or the taker's lands, never both. In row 3b two intents were run
		// twice that way, the late epoch fenced only after its backend call.
		next := rec.Renewed(now, p.opts.Lease, p.opts.ID, 0, 0)
		nrev, err := p.store.Update(ctx, wire.Key, next, rev)
		if err != nil {
			// A conflict: the record moved on (a taker's epoch, or a stale read); the
			// redelivery reads it again and decides. Unavailable: not claimed, not run.
			log.Info().Err(err).Msg("claiming a late job's lapsed epoch failed; will retry")
			_ = m.NakWithDelay(time.Second)
			return
		}
		rec, rev = next, nrev
		job = intent.JobOf(wire.Key, rec)
	}
	if mdErr == nil && md.NumDelivered > 1 {
		// A redelivery: the previous holder stopped acking. Take over only once its lease ran
		// out, and never from ourselves (p.runs above: this pool's execution may still be
		// retrying its outcome's write past its lease, finalRetry).
		now := p.opts.Now()
		abandoned, unheard := intent.Abandoned(ctx, p.js, p.store, wire.Key, rec, now, p.opts.Lease)
		if !abandoned && leaseHolds(rec, now) {
			if owner, gone := p.ownerGone(ctx, wire.Key, rec); gone {
				abandoned, unheard = true, fmt.Errorf("workers: owner %s gone (no responders for %s)", owner, jobs.PresenceSpan)
			}
		}
		if !abandoned {
			// Not yet: the lease runs (and its owner is there, or not known), or it ran out while
			// the records had no leader or its owner still runs it (intent.Abandoned). Asked
			// again at the lease's end, or within an ack wait while it runs: an owner that dies
			// later is then found gone in seconds too.
			_ = m.NakWithDelay(min(max(rec.LeaseUntil.Sub(now), 0)+100*time.Millisecond, ackWait(p.opts.Lease)))
			return
		}
		job, rec, rev, err = intent.TakeOver(ctx, p.js, p.store, job.Key, rec, rev, p.opts.Now, p.opts.Lease)
		if err != nil {
			log.Info().Err(err).Msg("takeover lost; dropping job")
			_ = m.Ack()
			return
		}
		p.opts.Metrics.Takeover()
		p.noteEvent(dashboard.EventTakeover, job.ID, job.Tenant, job.Model, "lease expired or owner gone: the job was redelivered")
		// The epoch changed: build the context again rather than add a second "epoch" field.
		log = p.opts.Log.With().Str(fieldJobID, wire.ID).Str(fieldKey, wire.Key).Int(fieldEpoch, job.Epoch).Logger()
		log.Warn().Int("previous_epoch", wire.Epoch).AnErr("owner_unheard", unheard).Str("server", p.js.Conn().ConnectedServerName()).
			Func(intent.LeaderRead(p.store)).Msg("took over execution after lease expiry or its owner's death")
	}
	p.execute(ctx, &execution{pool: p, job: job, msg: m, pub: p.publisher(job, wire.Notice, m), rec: rec, rev: rev, log: log})
}

// deliveredAgain reports whether another pool runs the epoch of rec, which a first delivery of
// its job, too old to be trusted (trustSent), found PENDING. JetStream's first delivery is not
// proof that nobody took the job before: a consumer's delivery count is not kept across a
// leader change (nats-server#5346), and a job stored twice (its submit's dedup lost in an
// election) is a new message. In the deployed row (issue 34) 12 of 13 duplicate executions
// began that way, seconds after an election, while the first execution's owner was still
// writing its outcome. Asking costs jobs.RunningWait when nobody answers, paid only by a job
// that waited in JOBS longer than freshJob.
func (p *Pool) deliveredAgain(ctx context.Context, key string, rec *kv.Record, log zerolog.Logger) bool {
	running, _ := jobs.Running(ctx, p.js.Conn(), key, rec.Epoch)
	if running {
		log.Info().Msg("a first delivery of a job another pool runs; left to it")
	}
	return running
}

// storedRequest returns rec with the request it stores in REQUESTS. When that cannot be read
// now, the job is redelivered in a second; when it is gone (kv.ErrRequestLost: it outlived the
// stream's age, or the stream lost it), the epoch is failed as a takeover fails it
// (intent.FailLostRequest) and the job acked. Either way ok is false and m is settled.
func (p *Pool) storedRequest(ctx context.Context, key string, rec *kv.Record, rev uint64, m jetstream.Msg, log zerolog.Logger) (_ *kv.Record, ok bool) {
	body, err := p.store.Request(ctx, key, rec)
	switch {
	case err == nil:
		return rec.WithRequest(body), true
	case errors.Is(err, kv.ErrRequestLost):
		if err := intent.FailLostRequest(ctx, p.js, p.store, key, rec, rev, p.opts.Now()); err != nil {
			log.Info().Err(err).Msg("failing a job whose stored request is gone failed; will retry")
			_ = m.NakWithDelay(time.Second)
			return nil, false
		}
		log.Error().Int("request_at", rec.RequestAt).Msg("the job's stored request is gone; failed its record")
		_ = m.Ack()
	default:
		log.Warn().Err(err).Msg("reading the stored request; will retry")
		_ = m.NakWithDelay(time.Second)
	}
	return nil, false
}

// publisher writes job's chunks to CHUNKS; a lone terminal chunk expires after the discard
// grace. A non-stream job whose follower listens on its notice subject (notice: Job.Notice)
// has its outcome sent there instead, unstored; a held job's (m) goes to the hub that
// admitted it first, in process.
func (p *Pool) publisher(job *jobs.Job, notice bool, m jetstream.Msg) *jobs.Publisher {
	pub := jobs.NewPublisher(p.js, job)
	pub.SetFinalTTL(p.opts.DiscardChunksAfter)
	if notice && !job.Stream {
		pub.SetNotice() // its followers listen for the outcome on the notice subject
		if h, ok := m.(*heldMsg); ok && h.local != nil {
			pub.SetLocal(h.local)
		}
	}
	return pub
}

// execute runs ex, known to takers elsewhere as running here (jobs.Running) and to the
// dashboard. It continues the trace of the request that created it (the record keeps its
// traceparent); its backend attempts are child spans (internal/backend).
func (p *Pool) execute(ctx context.Context, ex *execution) {
	job := ex.job
	ctx, span := p.opts.Tracer.StartFrom(ctx, job.Header, "oncegate.execution")
	defer span.End()
	span.SetAttributes(attribute.String("oncegate.job_id", job.ID), attribute.Int("oncegate.epoch", job.Epoch),
		attribute.String("oncegate.tenant", job.Tenant))
	if id := tracing.TraceID(ctx); id != "" {
		ex.log = ex.log.With().Str(fieldTraceID, id).Logger()
	}
	p.setRunning(job.Key, job.Epoch, true)
	defer p.setRunning(job.Key, job.Epoch, false)
	p.trackStart(ex)
	defer p.trackEnd(ex)
	ex.run(ctx)
}

// dropRequest deletes the stored request of rec, a finished record (kv.Store.DropRequest);
// nothing for a record that carries its own. A failure leaves it to the stream's age.
func (p *Pool) dropRequest(key string, rec *kv.Record, log zerolog.Logger) {
	if rec.RequestAt == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
	defer cancel()
	if err := p.store.DropRequest(ctx, key, rec); err != nil {
		log.Info().Err(err).Msg("dropping the stored request failed; the stream's age will")
	}
}

// dropTimeout bounds dropRequest: it runs after the answer, before the job's ack.
const dropTimeout = 2 * time.Second

// keyWait bounds how long a job waits for this pool's execution of the same key to end before
// it is handed back. That execution is usually writing its outcome (its charge, its ack): a
// new epoch of the key (an auto key reclaimed after its window, once the last answer was
// read) arrives then. Handed back, the job would come again as a redelivery, which waits for
// the epoch's lease to run out: a whole lease for an epoch nobody runs.
const keyWait = 2 * time.Second

// keyFree waits, at most keyWait, until this pool runs no execution of key: free is false if
// one still runs (or ctx ended), waited true if one ran when it was asked.
func (p *Pool) keyFree(ctx context.Context, key string) (free, waited bool) {
	if !p.runs(key) {
		return true, false
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(keyWait)
	for p.runs(key) {
		if !time.Now().Before(deadline) {
			return false, true
		}
		select {
		case <-ctx.Done():
			return false, true
		case <-t.C:
		}
	}
	return true, true
}

// runs reports whether this pool runs an execution of key now.
func (p *Pool) runs(key string) bool {
	p.runningMu.Lock()
	defer p.runningMu.Unlock()
	return len(p.running[key]) > 0
}

// runsEpoch reports whether this pool runs epoch of key now: what it answers jobs.Running.
func (p *Pool) runsEpoch(key string, epoch int) bool {
	p.runningMu.Lock()
	defer p.runningMu.Unlock()
	return slices.Contains(p.running[key], epoch)
}

func (p *Pool) setRunning(key string, epoch int, on bool) {
	p.runningMu.Lock()
	defer p.runningMu.Unlock()
	if on {
		p.running[key] = append(p.running[key], epoch)
		return
	}
	e := p.running[key]
	if i := slices.Index(e, epoch); i >= 0 {
		e = slices.Delete(e, i, i+1)
	}
	if len(e) == 0 {
		delete(p.running, key)
	} else {
		p.running[key] = e
	}
}

// Log field names.
const (
	fieldJobID = "job_id"
	fieldKey   = "idem_key_hash"
	fieldEpoch = "epoch"
	// fieldTraceID is the W3C trace id the execution continues (the API logs the same field).
	fieldTraceID = "trace_id"
)

// postLoop posts the backends' health to the board every two seconds.
func (p *Pool) postLoop(ctx context.Context) {
	if p.opts.Board == nil {
		return
	}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		if err := p.opts.Board.Post(ctx, p.opts.ID, map[string]any{"worker": p.opts.ID, "at": p.opts.Now().UTC(), "backends": p.Status()}); err != nil && ctx.Err() == nil {
			p.opts.Log.Debug().Err(err).Msg("posting status")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Pool) sweepLoop(ctx context.Context) {
	if p.opts.SweepEvery < 0 {
		return
	}
	// The first sweep comes soon after start: executions of a process that crashed (or of a
	// NATS restart that lost JOBS) are waiting for it.
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(p.opts.SweepEvery)
		}
		if n, err := p.Sweep(ctx); err != nil {
			p.opts.Log.Warn().Err(err).Msg("sweep")
		} else if n > 0 {
			p.opts.Log.Warn().Int("redriven", n).Msg("sweep re-drove executions whose lease ran out")
		}
	}
}

// Sweep takes over every PENDING record whose lease ran out and whose job is no longer in JOBS,
// and publishes its job again, so an execution whose job message was lost (JOBS is a memory
// stream) still completes. Only one taker wins each record (compare-and-set); it returns how
// many this call re-drove. The pool's first sweep reads the last record of every key, later
// ones only the records written since (kv.LeaseWatch). It also makes sure of the charge of
// every billable record that read found written more than ChargeGrace ago (sweepCharges).
func (p *Pool) Sweep(ctx context.Context) (int, error) {
	now := p.opts.Now()
	expired, err := p.leases.Expired(ctx, now)
	if err != nil {
		return 0, err
	}
	defer p.sweepCharges(ctx, now) // also when a re-drive fails: the read found them
	n := 0
	for _, e := range expired {
		rec, rev, ok := p.sweepCandidate(ctx, e.Key, p.store.Get, func(*kv.Record) bool { return true })
		if !ok {
			continue
		}
		abandoned, unheard := intent.Abandoned(ctx, p.js, p.store, e.Key, rec, now, p.opts.Lease)
		if !abandoned {
			continue
		}
		redriven, err := p.redrive(ctx, e.Key, rec, rev, "lease expired with no job left: re-driven by the sweep",
			"re-driven after lease expiry", func(ev *zerolog.Event) { ev.AnErr("owner_unheard", unheard) })
		if err != nil {
			return n, err
		}
		if redriven {
			n++
		}
	}
	gone, err := p.takeOverGone(ctx, now)
	return n + gone, err
}

// takeOverGone takes over the PENDING records, their lease still running, whose worker is
// another pool that is gone (jobs.PoolGone), and queues their job again: a held job's
// (held.go) whose node died, which no redelivery brings back. Each such worker is asked
// once per sweep, all of them at once; a pool that answers, or cannot be told gone, keeps
// its executions until their lease runs out (Sweep). It returns how many it re-drove.
func (p *Pool) takeOverGone(ctx context.Context, now time.Time) (int, error) {
	byWorker := map[string][]string{}
	for _, o := range p.leases.Owned(now) {
		if o.Worker != p.opts.ID {
			byWorker[o.Worker] = append(byWorker[o.Worker], o.Key)
		}
	}
	if len(byWorker) == 0 {
		return 0, nil
	}
	var mu sync.Mutex
	var gone []string
	var wg sync.WaitGroup
	for worker := range byWorker {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if jobs.PoolGone(ctx, p.js.Conn(), worker) {
				mu.Lock()
				gone = append(gone, worker)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(gone)
	n := 0
	for _, worker := range gone {
		redriven, err := p.takeOverAll(ctx, worker, byWorker[worker], "the sweep")
		n += redriven
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// takeOverAll takes over, with takeOverFrom, the executions of keys that worker, gone, still
// holds; it stops at the first error and returns how many it re-drove. by says who found the
// worker gone.
func (p *Pool) takeOverAll(ctx context.Context, worker string, keys []string, by string) (int, error) {
	n := 0
	for _, key := range keys {
		redriven, err := p.takeOverFrom(ctx, key, worker, by)
		if err != nil {
			return n, err
		}
		if redriven {
			n++
		}
	}
	return n, nil
}

// takeOverFrom takes over key's execution from worker, gone, and queues its job again, if
// the record (read from the leader) is still that worker's PENDING epoch and a candidate
// (sweepCandidate): true if it did.
func (p *Pool) takeOverFrom(ctx context.Context, key, worker, by string) (bool, error) {
	rec, rev, ok := p.sweepCandidate(ctx, key, p.store.Latest, func(rec *kv.Record) bool {
		return rec.State == kv.Pending && rec.Worker == worker
	})
	if !ok {
		return false, nil
	}
	return p.redrive(ctx, key, rec, rev, "its worker is gone: re-driven by "+by,
		"re-driven: its worker is gone", func(ev *zerolog.Event) { ev.Str("gone_worker", worker).Str("found_by", by) })
}

// sweepCandidate reads key's record with read for a re-drive by the sweep, and reports
// whether it is one: not while a job of the key is in JOBS (it will run, or be redelivered
// after its AckWait), nor while this pool runs the key (still retrying its outcome's write
// past the lease: finalRetry), nor when cancelled or not kept by keep; a claim stored after
// its request was refused (503) is released instead.
func (p *Pool) sweepCandidate(ctx context.Context, key string, read func(context.Context, string) (*kv.Record, uint64, error),
	keep func(*kv.Record) bool) (*kv.Record, uint64, bool) {
	if queued, err := jobs.Queued(ctx, p.js, key); err != nil || queued {
		return nil, 0, false
	}
	if p.runs(key) {
		return nil, 0, false
	}
	rec, rev, err := read(ctx, key)
	if err != nil || rec.Cancelled || !keep(rec) {
		return nil, 0, false
	}
	if released, err := intent.ReleaseRefused(ctx, p.store, key, rec, rev); err != nil || released {
		if released {
			p.opts.Log.Warn().Str(fieldJobID, rec.JobID).Str(fieldKey, key).Int(fieldEpoch, rec.Epoch).Time("admit_by", rec.AdmitBy).
				Msg("a claim stored after its request was refused (503): released, not executed")
		}
		return nil, 0, false
	}
	return rec, rev, true
}

// redrive takes key's execution rec (at rev) over and queues its job again, noting why on
// the dashboard and logging msg with what fields adds: false if another taker won or the
// record moved on.
func (p *Pool) redrive(ctx context.Context, key string, rec *kv.Record, rev uint64, why, msg string, fields func(*zerolog.Event)) (bool, error) {
	job, _, _, err := intent.TakeOver(ctx, p.js, p.store, key, rec, rev, p.opts.Now, p.opts.Lease)
	if err != nil {
		return false, nil
	}
	p.opts.Metrics.Takeover()
	p.noteEvent(dashboard.EventTakeover, job.ID, job.Tenant, job.Model, why)
	if err := jobs.Submit(ctx, p.js, job); err != nil {
		return false, err
	}
	ev := p.opts.Log.Warn().Str(fieldJobID, job.ID).Str(fieldKey, key).Int(fieldEpoch, job.Epoch).Str("server", p.js.Conn().ConnectedServerName())
	fields(ev)
	ev.Func(intent.LeaderRead(p.store)).Msg(msg)
	return true, nil
}

// announce writes the terminal chunk of rec's epoch, a finished record's, unless the chunk
// subject already ends with one (see jobs.Announce). It reports false when it could not. A
// streamed output is announced as stored (jobs.KindStored): whoever writes it cannot know
// whether every output chunk is on the subject, so followers answer from the record.
func (p *Pool) announce(ctx context.Context, key string, rec *kv.Record, log zerolog.Logger) bool {
	res := rec.Result
	if res == nil {
		return true // nothing to announce: a cancellation writes its own terminal chunk
	}
	c := jobs.Chunk{Kind: jobs.KindError, Status: res.Status, Payload: res.Body,
		Meta: jobs.Meta{Backend: res.Backend, Attempts: res.Attempts, Degraded: res.Degraded, ContentType: res.ContentType}}
	switch {
	case rec.Stream && (rec.State == kv.Completed && res.Status == http.StatusOK || res.Partial):
		c.Kind, c.Payload = jobs.KindStored, nil
	case rec.State == kv.Completed, res.Degraded && res.Status == http.StatusOK:
		c.Kind = jobs.KindResult
	}
	wrote, err := jobs.Announce(ctx, p.js, key, rec.JobID, rec.Epoch, c)
	if err != nil {
		log.Warn().Err(err).Msg("writing the terminal chunk of a finished execution")
		return false
	}
	if wrote {
		log.Info().Str("state", string(rec.State)).Msg("terminal chunk written for a finished execution (its worker stopped before)")
	}
	return true
}
