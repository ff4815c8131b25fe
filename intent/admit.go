package intent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// errGone: the record read for a decision vanished (expired) or ended (a takeover failed it)
// in between; decide again.
var errGone = errors.New("intent: record vanished")

// maxDecisions bounds Admit's attempts when the record keeps changing under it.
const maxDecisions = 5

// Admit decides what req is attached to: it claims the key or finds what already holds it
// (see the state table in kv/record.go). Only a claim, a reclaim, a takeover and the job
// publish write; joins and replays only read, and a replay of a cached final record or a join
// of an execution this node already follows does not even read.
func (c *Core) Admit(ctx context.Context, req *Request) (*Admission, error) {
	ctx, cancel := context.WithTimeout(ctx, c.storeWait(req))
	defer cancel()
	if err := c.limitsOf(req.Tenant).request(c.now()); err != nil {
		return nil, err
	}
	if req.Bypass {
		return c.bypass(ctx, req)
	}
	if rec, rev, ok := c.finishedRecord(req); ok {
		adm, err := c.attach(ctx, req, &kv.ExistsError{Record: rec, Rev: rev}, false)
		if !errors.Is(err, errGone) && !errors.Is(err, kv.ErrConflict) {
			if err == nil && adm.Outcome == Replayed {
				c.metrics.ReplayCacheHit()
			}
			return adm, err
		}
		c.finished.forget(req.Key)
	}
	if adm, ok := c.joinLocal(req); ok {
		return adm, nil
	}
	if tier := c.coldOf(req.Key); tier != nil {
		if adm, done, err := c.admitCold(ctx, req, tier); done {
			return adm, err
		}
	}
	for range maxDecisions {
		adm, err := c.create(ctx, req, req.Key, c.newJobID(req.Key), Created)
		if !errors.Is(err, kv.ErrExists) {
			return adm, err
		}
		var held *kv.ExistsError // the claim already read the record that holds the key
		errors.As(err, &held)
		adm, err = c.attach(ctx, req, held, false)
		if errors.Is(err, errGone) || errors.Is(err, kv.ErrConflict) {
			continue // expired or changed under us: decide again
		}
		if err == nil && held != nil && adm.Outcome == Replayed && !req.Auto {
			c.finished.put(req.Key, held.Record, held.Rev, c.opts.TTL, c.now())
		}
		return adm, err
	}
	return nil, ErrContended
}

// newClaim is a PENDING claim for req: it names the job, the epoch, the fingerprint, a lease,
// and carries the request so the job can be re-driven from it (a large one, it names in
// REQUESTS: launch stores it there).
func (c *Core) newClaim(req *Request, jobID string, epoch int) *kv.Record {
	rec := c.newRecord(req, jobID, epoch)
	if c.storeOf(req.Key).StoresRequest(len(req.Body)) {
		rec.StoreRequestOut()
	}
	return rec
}

// newRecord is the PENDING record of req's execution, with the request in it.
func (c *Core) newRecord(req *Request, jobID string, epoch int) *kv.Record {
	now := c.now()
	rec := &kv.Record{State: kv.Pending, Tenant: req.Tenant, JobID: jobID, Epoch: epoch, Fingerprint: req.Fingerprint,
		Owner: kv.NewOwner(), Auto: req.Auto, Bypassed: req.Bypass, Created: now, Arrived: req.arrival(now), EpochStarted: now,
		LeaseUntil: now.Add(c.opts.Lease), Progress: kv.ProgressQueued, Model: req.Model, API: req.API, Path: req.Path,
		Backends: req.Backends, Degraded: req.Degraded.record(), Stream: req.Stream, Request: req.Body, Header: req.Header, Deadline: req.Deadline, TraceID: req.TraceID,
		Echo: req.Echo}
	return rec
}

// create claims key with a new record and publishes its job; kv.ErrExists if taken.
func (c *Core) create(ctx context.Context, req *Request, key, jobID string, outcome Outcome) (*Admission, error) {
	res, err := c.reserve(ctx, req, jobID)
	if err != nil {
		// A copy of an intent that already exists is never refused by a budget, by the
		// node's bounds or by the tenant's caps on executions: it costs no backend call.
		if c.held(ctx, key, err) {
			return nil, fmt.Errorf("intent: claim: %w", kv.ErrExists)
		}
		return nil, err
	}
	rec := c.newClaim(req, jobID, 1)
	rec.AdmitBy = admitBy(ctx)
	slot := c.holdSlot(key)
	if slot != nil {
		rec.Worker = slot.Worker() // its death is how another node finds the job (jobs.HeldMsg)
	}
	data, err := kv.Encode(rec) // written by the claim, and the job message's record
	if err != nil {
		releaseSlot(slot)
		res.cancel()
		return nil, fmt.Errorf("intent: claim: %w", err)
	}
	rev, err := c.storeOf(key).ClaimEncoded(ctx, key, rec, data)
	if err != nil {
		releaseSlot(slot)
		c.noteRefused(key, rec, err)
		res.cancel()
		if errors.Is(err, kv.ErrExists) {
			return nil, err
		}
		return nil, fmt.Errorf("intent: claim: %w", err)
	}
	return c.launchReserved(ctx, req, key, rec, rev, data, outcome, true, res, slot)
}

// holdSlot reserves a worker slot of this node for a new execution of key (Deps.Hold); nil:
// its job is queued.
func (c *Core) holdSlot(key string) HeldSlot {
	if c.holder == nil {
		return nil
	}
	return c.holder.Hold(key)
}

// releaseSlot gives slot back, if any.
func releaseSlot(slot HeldSlot) {
	if slot != nil {
		slot.Release()
	}
}

// admitBy is when an admission's write (a claim, a reclaim) stops being tried and the request
// is refused: the end of ctx (Admit's patience, storeWait), or jsretry.Window from now without
// one. The write carries it (kv.Record.AdmitBy), so one the store takes only after that
// instant, when the client was already refused, is released instead of executed.
func admitBy(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(jsretry.Window)
}

// storeWait is how long Admit waits for an unavailable store before it refuses req: the
// client's stated timeout less a margin (a tenth, at least storeWaitMargin), so that the 503
// reaches it before it gives up, at most Options.StoreWaitMax; Options.StoreWait when the
// client states none. A client that waits longer than an election (4-9 s after a leader's
// crash) is answered once the store is back instead of refused on its first attempt.
func (c *Core) storeWait(req *Request) time.Duration {
	def := cmp.Or(c.opts.StoreWait, jsretry.Window)
	if req.ClientTimeout <= 0 {
		return def
	}
	wait := req.ClientTimeout - max(req.ClientTimeout/10, storeWaitMargin)
	return min(max(wait, minStoreWait), cmp.Or(c.opts.StoreWaitMax, def))
}

// storeWaitMargin is the least time between a refusal and the client's own timeout;
// minStoreWait the least wait a short stated timeout leaves.
const (
	storeWaitMargin = time.Second
	minStoreWait    = time.Second
)

// held says whether key already has a record, for a request that reserve refused with
// refusal. A refusal the client retries (the node's bounds, a tenant's cap) asks one replica
// once: shedding must cost little, and a copy it misses gets a retryable answer. The budget's
// refusal is final, so it reads as Get does (retries, and the leader on a miss).
func (c *Core) held(ctx context.Context, key string, refusal error) bool {
	if errors.Is(refusal, ErrOverloaded) || errors.Is(refusal, ErrTenantLimit) {
		return c.storeOf(key).Held(ctx, key)
	}
	_, _, err := c.storeOf(key).Get(ctx, key)
	return err == nil
}

// launchReserved launches a new execution holding its reservation.
func (c *Core) launchReserved(ctx context.Context, req *Request, key string, rec *kv.Record, rev uint64, data []byte, outcome Outcome, newJob bool, res *reservation, slot HeldSlot) (*Admission, error) {
	adm, err := c.launch(ctx, req, key, rec, rev, data, outcome, newJob, slot)
	if err != nil {
		res.cancel()
		return nil, err
	}
	c.hold(adm, req, res)
	return adm, nil
}

// hold gives adm, a new execution's admission, its reservation: Done settles it.
func (c *Core) hold(adm *Admission, req *Request, res *reservation) {
	adm.settle = func() { res.settle(res.budget) } // the ledger charge replaces it once written
	if adm.leave == nil {
		adm.leave = res.unstream
	} else {
		adm.leave = both(adm.leave, res.unstream)
	}
}

// runLocal runs a bypassed request's execution on this node's workers for this request
// alone (LocalRunner): nothing can join or replay it, so nothing is written for it but its
// ledger charge: no record, job, job index or chunks. The reservation (budget, the node's
// bounds, the tenant's caps) is taken as for any new execution. ran is false when it was not
// run here — no workers in this process, a background or retrievable request (its job id is
// a handle the client keeps), no free worker slot — and the job path runs it instead.
func (c *Core) runLocal(ctx context.Context, req *Request, key, jobID string) (adm *Admission, ran bool, err error) {
	if c.local == nil || req.Async || req.Retrievable {
		return nil, false, nil
	}
	res, err := c.reserve(ctx, req, jobID)
	if err != nil {
		return nil, true, err
	}
	rec := c.newRecord(req, jobID, 1)
	fl, out, err := c.hubOf(key).Local(jobs.ChunkSubject(key, rec.JobID, rec.Epoch))
	if err != nil {
		res.cancel()
		return nil, true, fmt.Errorf("intent: %w", err)
	}
	if !c.local.RunLocal(JobOf(key, rec), rec, out) {
		fl.Close()
		res.cancel()
		return nil, false, nil
	}
	var leave func()
	if c.followers != nil {
		leave, _ = c.follow(key, rec, false, 0)
	}
	adm = c.admission(Bypassed, key, rec, fl, leave)
	adm.local = true
	c.hold(adm, req, res)
	return adm, true, nil
}

// launch subscribes to the epoch's chunks, then publishes its job (that order means no chunk
// can be missed), and indexes the job id. data is rec as stored at rev (nil: encode it here).
// A new claim's request too large for its record is stored first (a job never runs that a
// re-drive could not run again); the job names it (jobs.Job.RequestStored) and its worker
// reads it from there, so the request is not in JOBS as well. A worker of this node takes the
// record, request included, from the offer made to it (Deps.Offer) until the admission closes.
// With slot (a worker slot of this node the claim names, else nil), the job is held: run here,
// not queued, its claim its only stored message (jobs.HeldMsg); launch runs or releases the
// slot.
func (c *Core) launch(ctx context.Context, req *Request, key string, rec *kv.Record, rev uint64, data []byte, outcome Outcome, newJob bool, slot HeldSlot) (*Admission, error) {
	if rec.RequestAt > 0 && rec.RequestAt == rec.Epoch {
		if err := c.storeOf(key).PutRequest(ctx, key, rec); err != nil {
			releaseSlot(slot)
			c.release(key, rec, rev)
			return nil, fmt.Errorf("intent: %w", err)
		}
	}
	if data == nil {
		var err error
		if data, err = kv.Encode(rec); err != nil {
			releaseSlot(slot)
			c.release(key, rec, rev)
			return nil, fmt.Errorf("intent: %w", err)
		}
	}
	job := JobEncoded(key, rec, rev, data)
	hub := c.hubOf(key)
	open := hub.Open
	var local jobs.LocalNotices
	if !rec.Stream {
		// Its outcome comes as a notice when the hub follows notices; the job says so. A held
		// job's comes in process (Hub.OpenHeld).
		open, job.Notice = hub.OpenNonStream, hub.Notices()
		if slot != nil && job.Notice {
			open, local = hub.OpenHeld, hub
		}
	}
	fl, err := open(ctx, job.Subject())
	if err != nil {
		releaseSlot(slot)
		c.release(key, rec, rev)
		return nil, fmt.Errorf("intent: follow %s: %w", job.ID, err)
	}
	withdraw := func() {} // the offer comes before the job, which a worker may take at once
	if c.offer != nil {
		withdraw = c.offer.Offer(key, rec.Epoch, rev, rec)
	}
	if err := c.submit(ctx, job, slot, local); err != nil {
		fl.Close()
		withdraw()
		c.release(key, rec, rev)
		return nil, fmt.Errorf("intent: %w", err)
	}
	if newJob && (req.Async || req.Retrievable) { // a synchronous job is found by its progress (kv.JobKey)
		if err := c.storeOf(key).IndexJob(ctx, job.ID, key); err != nil {
			c.log.Warn().Err(err).Str(fieldJobID, job.ID).Msg("indexing job id")
		}
	}
	c.remember(key, rec)
	var leave func()
	if c.followers != nil {
		leave, _ = c.follow(key, rec, outcome == Joined, 0)
	}
	adm := c.admission(outcome, key, rec, fl, leave)
	adm.withdraw = withdraw
	return adm, nil
}

// submit runs job in slot when there is one (held: its notices going to local first), else
// stores it in JOBS, queued for any node's workers.
func (c *Core) submit(ctx context.Context, job *jobs.Job, slot HeldSlot, local jobs.LocalNotices) error {
	if slot == nil {
		return jobs.Submit(ctx, c.js, job)
	}
	m, err := jobs.HeldMsg(job)
	if err != nil {
		slot.Release()
		return err
	}
	slot.Run(m, time.Now(), local) // the workers trust a fresh job by the wall clock (trustSent)
	return nil
}

// admission is the decision; leave (nil: none) is what Done gives back of a followed
// execution: its place among the execution's copies and the tenant's stream.
func (c *Core) admission(outcome Outcome, key string, rec *kv.Record, fl *jobs.Follower, leave func()) *Admission {
	return &Admission{Outcome: outcome, Key: key, Rec: rec, JobID: rec.JobID, core: c, fl: fl, leave: leave}
}

// join takes req's places as a copy following key's live execution rec on this node: one of
// the execution's copies (under the tenant's followers per job) and, for a streamed answer,
// one of the tenant's streams; a *LimitError above either cap. leave gives them back.
func (c *Core) join(req *Request, key string, rec *kv.Record) (leave func(), err error) {
	lim := c.limitsOf(req.Tenant)
	unstream := func() {}
	if req.Stream {
		if unstream, err = lim.stream(); err != nil {
			return nil, err
		}
	}
	if c.followers == nil {
		return unstream, nil
	}
	unfollow, err := c.follow(key, rec, true, lim.followersPerJob())
	if err != nil {
		unstream()
		return nil, err
	}
	return both(unfollow, unstream), nil
}

// release marks a claim whose job could not be published as a retryable failure, so the
// client's retry re-executes.
func (c *Core) release(key string, rec *kv.Record, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	released := rec.Released()
	if _, err := c.storeOf(key).Update(ctx, key, released, rev); err != nil {
		c.log.Warn().Err(err).Str(fieldKey, key).Msg("releasing claim")
		return
	}
	if err := c.storeOf(key).DropRequest(ctx, key, released); err != nil {
		c.log.Debug().Err(err).Str(fieldKey, key).Msg("dropping a released claim's request")
	}
}

// attach handles a key that already has a record (held, when the claim already read it).
// fresh says the record was read from the bucket's leader (kv.Store.Latest).
func (c *Core) attach(ctx context.Context, req *Request, held *kv.ExistsError, fresh bool) (*Admission, error) {
	var rec *kv.Record
	var rev uint64
	if held != nil {
		rec, rev = held.Record, held.Rev
	} else {
		var err error
		rec, rev, err = c.storeOf(req.Key).Get(ctx, req.Key)
		if errors.Is(err, kv.ErrNotFound) {
			return nil, errGone
		}
		if err != nil {
			return nil, fmt.Errorf("intent: read record: %w", err)
		}
	}
	if rec.Tenant != req.Tenant {
		return nil, ErrKeyForeign
	}
	if rec.Fingerprint != req.Fingerprint {
		return nil, ErrKeyReused
	}
	now := c.now()
	rule := c.match(req, rec, req.arrival(now))
	if rule == "" {
		// Identical content after the window is a new intent, not a copy.
		if rec.State == kv.Pending {
			jobID := c.newJobID(req.Key)
			return c.create(ctx, req, partition.OfKey(req.Key).Tagged(HashParts(req.Key, jobID)), jobID, Created)
		}
		c.archive(ctx, req.Key, rec)
		return c.reclaim(ctx, req, rec, rev, c.newJobID(req.Key))
	}
	switch rec.State {
	case kv.Pending:
		if !fresh && !c.hubOf(req.Key).Following(jobs.ChunkSubject(req.Key, rec.JobID, rec.Epoch)) {
			// A replica's PENDING may be old news: confirmed by the leader before this node
			// follows the execution (a new consumer costs more than the read) or takes it over.
			lrec, lrev, err := c.storeOf(req.Key).Latest(ctx, req.Key)
			switch {
			case errors.Is(err, kv.ErrNotFound):
				return nil, errGone
			case err != nil:
				return nil, fmt.Errorf("intent: read record: %w", err)
			case lrev != rev:
				return c.attach(ctx, req, &kv.ExistsError{Record: lrec, Rev: lrev}, true)
			}
		}
		if abandoned, unheard := c.abandoned(ctx, req.Key, rec, now); abandoned {
			job, nrec, nrev, err := TakeOver(ctx, c.js, c.storeOf(req.Key), req.Key, rec, rev, c.now, c.opts.Lease)
			if errors.Is(err, kv.ErrRequestLost) {
				// Failed for want of its stored request: decide again (a retryable failure is
				// reclaimed with this request's own body).
				return nil, fmt.Errorf("%w: %w", errGone, err)
			}
			if err != nil {
				return nil, err
			}
			c.log.Warn().Str(fieldJobID, job.ID).Int("epoch", job.Epoch).AnErr("owner_unheard", unheard).Str("server", c.js.Conn().ConnectedServerName()).
				Func(LeaderRead(c.storeOf(req.Key))).Msg("lease expired; execution re-driven by a client request")
			c.metrics.Takeover()
			adm, err := c.launch(ctx, req, req.Key, nrec, nrev, job.Record, Joined, false, nil)
			if adm != nil {
				adm.redriven = true // it joined the intent, but its request runs it again
			}
			return explain(adm, rule, req.RetryHeader, rec), err
		}
		c.checkHolder(req.Key, rec) // usually a retry: its first try's node may have died
		// The feed first, the places after: a place given back is observed as a follower
		// that left (oncegate_followers_per_execution), so none is taken for a join that fails.
		fl, err := c.joinExecution(ctx, req.Key, rec.JobID, rec.Epoch, rec.Stream)
		if err != nil {
			return nil, fmt.Errorf("intent: join: %w", err)
		}
		leave, err := c.join(req, req.Key, rec)
		if err != nil {
			fl.Close()
			return nil, err
		}
		c.remember(req.Key, rec)
		return explain(c.admission(Joined, req.Key, rec, fl, leave), rule, req.RetryHeader, rec), nil
	case kv.Failed:
		if rec.Result != nil && rec.Result.Retryable && !rec.Cancelled {
			return c.reclaim(ctx, req, rec, rev, rec.JobID)
		}
	}
	return explain(c.admission(Replayed, req.Key, rec, nil, nil), rule, req.RetryHeader, rec), nil
}

// archive keeps a finished execution reachable by its job id before its auto key moves on to
// a newer identical request (the auto key matches the most recent one).
func (c *Core) archive(ctx context.Context, key string, rec *kv.Record) {
	archived := partition.OfKey(key).Tagged(HashParts(key, rec.JobID)) // in key's partition, as its job id is
	if _, err := c.storeOf(key).Claim(ctx, archived, rec.Archived(key)); err != nil && !errors.Is(err, kv.ErrExists) {
		c.log.Warn().Err(err).Str(fieldJobID, rec.JobID).Msg("archiving a finished execution")
		return
	}
	if err := c.storeOf(key).IndexJob(ctx, rec.JobID, archived); err != nil {
		c.log.Warn().Err(err).Str(fieldJobID, rec.JobID).Msg("re-indexing an archived execution")
	}
}

// checkHolder has the holder of key's held execution rec asked for at once (Deps.CheckHolder):
// a dead holder's execution is taken over without waiting for a sweep.
func (c *Core) checkHolder(key string, rec *kv.Record) {
	if c.checker != nil && rec.Worker != "" {
		c.checker.CheckHolder(key, rec)
	}
}

// abandoned: rec's lease ran out, its job is no longer in JOBS and its owner is gone
// (Abandoned), so a client's request re-drives it.
func (c *Core) abandoned(ctx context.Context, key string, rec *kv.Record, now time.Time) (bool, error) {
	if !rec.LeaseExpired(now) || c.stillQueued(ctx, key) {
		return false, nil
	}
	return Abandoned(ctx, c.js, c.storeOf(key), key, rec, now, c.opts.Lease)
}

// stillQueued: the job of key is still in JOBS (waiting for a worker, or delivered and not
// acked), so it will run or be redelivered; an expired lease alone does not make it lost.
func (c *Core) stillQueued(ctx context.Context, key string) bool {
	queued, err := jobs.Queued(ctx, c.js, key)
	return err != nil || queued // when unsure, do not take over
}

// reclaim replaces a finished record by compare-and-set with a new PENDING epoch (epochs keep
// growing on one key, so chunk subjects never repeat).
func (c *Core) reclaim(ctx context.Context, req *Request, old *kv.Record, rev uint64, jobID string) (*Admission, error) {
	rec := c.newClaim(req, jobID, old.Epoch+1)
	if jobID == old.JobID {
		rec.Created, rec.Arrived = old.Created, old.Arrived
	}
	res, err := c.reserve(ctx, req, jobID)
	if err != nil {
		return nil, err
	}
	rec.AdmitBy = admitBy(ctx)
	nrev, err := c.storeOf(req.Key).UpdateBefore(ctx, req.Key, rec, rev, rec.AdmitBy)
	if err != nil {
		c.noteRefused(req.Key, rec, err)
		res.cancel()
		return nil, err
	}
	return c.launchReserved(ctx, req, req.Key, rec, nrev, nil, Created, jobID != old.JobID, res, nil)
}

// Log field names.
const (
	fieldJobID = "job_id"
	fieldKey   = "idem_key_hash"
)
