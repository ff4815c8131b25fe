package workers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/oncegate/oncegate/dialect/openai"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// maxBackendBody bounds a non-stream backend response (and error bodies).
const maxBackendBody = 16 << 20

// coalesceBytes caps one data chunk: events already read from the socket are batched up to it.
const coalesceBytes = 16 << 10

// errFenced means this worker lost its record (lease taken over or job cancelled).
var errFenced = errors.New("workers: fenced")

// output is where an execution's chunks go: its subject in CHUNKS (jobs.Publisher), or the
// in-memory feed of a request run where it was admitted (jobs.LocalPublisher).
type output interface {
	SetMeta(m jobs.Meta)
	Publish(ctx context.Context, kind jobs.Kind, status int, payload []byte) error
	PublishRetry(ctx context.Context, kind jobs.Kind, status int, payload []byte, retryAfter int) error
	Next() int
	ExpiresAlone() bool
}

// acker settles the job message an execution runs (jetstream.Msg).
type acker interface {
	Ack() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
}

// execution is one epoch of one job on this worker.
type execution struct {
	pool *Pool
	job  *jobs.Job
	msg  acker
	log  zerolog.Logger
	pub  output
	// unrecorded: the execution has no stored record (a bypass run where it was admitted,
	// Pool.RunLocal): its record writes stay here, no lease is renewed, no progress written.
	unrecorded bool

	mu  sync.Mutex // guards rec, rev and unsure: the renewer and the main flow both write the record
	rec *kv.Record
	rev uint64
	// unsure are the records written over rev that failed unavailable, oldest first: any of
	// them may have landed (see update). Not only the last: in row 3b a renewal that timed
	// out on an isolated leader landed after the heal, after a later one had replaced it here,
	// and the execution took its own record for a taker's and stopped.
	unsure []*kv.Record
	// tokens counts output events published (≈ tokens), for progress in the record.
	tokens atomic.Int64
	// progress is what the status API reads while the execution runs (progress.go).
	progress progress

	// feedLost is the chunk publish that failed for a reason other than a fence: from it on
	// the output goes to the record only (see relay.publish).
	feedLost error

	backend  string // the backend that answered
	attempts int    // backend attempts made (retries, fallbacks, continuations)
	// earlier are the intent's attempts before this epoch (cut off by takeovers or cancels,
	// as the record counts them): the answer's Oncegate-Attempts says them all, as the
	// record and its replays do.
	earlier   int
	ambiguous int  // attempts written and ended without an answer
	degraded  bool // the route's degraded answer was given

	tried map[string]int // attempts made per backend (see tryBackends)

	// began is when the first attempt was about to be sent, firstChunk when a stream's first
	// output reached the relay; observed: the GenAI operation was recorded (genai.go).
	began, firstChunk time.Time
	observed          bool
}

func (ex *execution) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ex.mu.Lock()
	ex.earlier = ex.rec.Attempts
	ex.mu.Unlock()
	if !ex.unrecorded {
		renewDone := make(chan struct{})
		go func() {
			defer close(renewDone)
			ex.renewLoop(ctx, cancel)
		}()
		defer func() {
			cancel()
			<-renewDone
		}()
		stopProgress := ex.startProgress(ctx)
		defer stopProgress()
	}

	ex.startGenAI(ctx)
	ans, fail := ex.dispatch(ctx, ex.job.Body)
	if fail != nil {
		if ctx.Err() != nil {
			return // fenced or shutting down: the new owner answers
		}
		ex.finishFailed(ctx, fail)
		return
	}
	defer ans.cancel()
	defer ans.resp.Body.Close()
	ex.backend = ans.backend.Name()
	ex.pub.SetMeta(ex.meta())
	ex.dispatched()

	if ex.job.API == backend.APIPassthrough {
		ex.finishPassthrough(ctx, ans)
		return
	}
	if ans.resp.StatusCode != http.StatusOK {
		// A 4xx that will fail the same way again is the outcome: stored and replayed.
		body, _ := io.ReadAll(io.LimitReader(ans.resp.Body, maxBackendBody))
		ans.report(true)
		ex.finishCompleted(ctx, &kv.Result{Status: ans.resp.StatusCode, Body: ans.errorBody(body)}, jobs.KindResult)
		return
	}
	if !ex.job.Stream {
		body, ok := ex.readAnswer(ctx, ans)
		if !ok {
			return
		}
		res, ok := ex.answerResult(ctx, ans, body)
		if !ok {
			return
		}
		ex.finishCompleted(ctx, res, jobs.KindResult)
		return
	}
	r, ans, ok := ex.relayFirstToken(ctx, ans)
	if r == nil {
		return // settled before the first token (see firsttoken.go)
	}
	for !ok && ctx.Err() == nil && r.canContinue(ans.backend) {
		ans.report(false)
		cont, cancelCont, err := r.continuation(ctx, ans.dialect, ans.backend)
		if err != nil {
			ex.log.Warn().Err(err).Msg("stream continuation failed")
			break
		}
		ok = r.run(ctx, cont.Body, true)
		cont.Body.Close()
		cancelCont()
	}
	ans.report(ok)
	if ctx.Err() != nil {
		return
	}
	r.finish(ctx, ok)
}

// readAnswer reads a non-stream answer's body and reports the call to the breaker. A body cut
// off after it was generated ends the execution (failed, ambiguous: never sent again), and ok
// is false.
func (ex *execution) readAnswer(ctx context.Context, ans *answer) (body []byte, ok bool) {
	body, err := io.ReadAll(io.LimitReader(ans.resp.Body, maxBackendBody))
	if err != nil {
		ans.report(false)
		if ctx.Err() != nil {
			return nil, false
		}
		ex.ambiguous++
		ex.finishFailed(ctx, &failure{status: http.StatusBadGateway, ambiguous: true, body: ex.errorBody(http.StatusBadGateway, "backend_truncated",
			"the model backend's response was cut off after it was generated; not sent again")})
		return nil, false
	}
	ans.report(true)
	return body, true
}

// answerResult is the stored result of a non-stream answer's body, in the client's API; ok is
// false when the dialect could not read it (the execution ended failed, ambiguous: the
// backend ran it).
func (ex *execution) answerResult(ctx context.Context, ans *answer, body []byte) (*kv.Result, bool) {
	if ans.dialect == nil {
		return &kv.Result{Status: http.StatusOK, Body: body, Usage: kvUsage(openai.UsageOf(body))}, true
	}
	out, usage, err := ans.dialect.Answer(body, ex.job.Model)
	if err == nil {
		ex.annotateAttempt(backend.AttemptSpan(ans.resp.Body), false, out, usage)
	}
	if err != nil {
		ex.ambiguous++
		ex.log.Warn().Err(err).Str("backend", ans.backend.Name()).Msg("the backend's answer could not be read")
		ex.finishFailed(ctx, &failure{status: http.StatusBadGateway, ambiguous: true, body: ex.errorBody(http.StatusBadGateway, "backend_bad_answer",
			"the model backend's answer could not be read; not sent again")})
		return nil, false
	}
	return &kv.Result{Status: http.StatusOK, Body: out, Usage: kvUsage(usage)}, true
}

// errorBody is a backend's error body in the client's API.
func (a *answer) errorBody(body []byte) []byte {
	if a.dialect == nil {
		return body
	}
	return a.dialect.ErrorBody(a.resp.StatusCode, body)
}

// meta is what the client's response headers say about how the answer was obtained.
func (ex *execution) meta() jobs.Meta {
	return jobs.Meta{Backend: ex.backend, Attempts: ex.earlier + ex.attempts, Degraded: ex.degraded}
}

// finishCompleted stores the outcome durably, then publishes the terminal chunk and acks: a
// client is answered only after COMPLETED is stored.
func (ex *execution) finishCompleted(ctx context.Context, res *kv.Result, terminal jobs.Kind) {
	if err := ex.writeFinal(ctx, kv.Completed, res); err != nil {
		ex.abandon(err)
		return
	}
	var payload []byte
	if terminal == jobs.KindResult {
		payload = res.Body
	}
	ex.announceCharged(ctx, terminal, res.Status, payload)
}

// announceCharged announces a billable outcome once it is stored, charges it and settles the
// job. A recorded execution is charged after its terminal chunk (the client does not wait for
// the ledger; should the worker die first, the record lets the charge sweep make it). An
// unrecorded one is charged before: nothing else would charge it, and an answer given must be
// an answer billed.
func (ex *execution) announceCharged(ctx context.Context, kind jobs.Kind, status int, payload []byte) {
	if ex.unrecorded {
		ex.chargeFinal()
	}
	if h := ex.pool.testHookBeforeAnnounce; h != nil && h() {
		return // the test's worker dies here: outcome stored, no terminal chunk, no ack
	}
	announced := ex.announce(ctx, kind, status, payload, 0)
	ex.discard()
	if h := ex.pool.testHookBeforeCharge; h != nil && h() {
		return // the test's worker dies here: outcome stored and announced, no charge, no ack
	}
	if !ex.unrecorded {
		ex.chargeFinal()
	}
	ex.settle(announced)
}

// announce publishes the terminal chunk once the outcome is stored. It reports false when it
// could not (NATS stayed unavailable past the retry window, or the worker is stopping).
func (ex *execution) announce(ctx context.Context, kind jobs.Kind, status int, payload []byte, retryAfter int) bool {
	if ex.feedLost != nil { // the subject may not hold every output chunk: followers read the record
		if _, err := jobs.Announce(ctx, ex.pool.js, ex.job.Key, ex.job.ID, ex.job.Epoch, jobs.Chunk{Kind: jobs.KindStored, Meta: ex.meta()}); err != nil {
			ex.log.Warn().Err(err).Msg("announcing the stored outcome failed; the job's redelivery will write it")
			return false
		}
		return true
	}
	if err := ex.pub.PublishRetry(ctx, kind, status, payload, retryAfter); err != nil {
		ex.log.Warn().Err(err).Msg("publishing the terminal chunk failed; the job's redelivery will write it")
		return false
	}
	return true
}

// settle acks the job, or, when its terminal chunk is unwritten, leaves it to be redelivered:
// the redelivery finds the outcome stored and writes the terminal chunk (Pool.handle), so
// the copies following the execution are not left waiting for it.
func (ex *execution) settle(announced bool) {
	if announced {
		_ = ex.msg.Ack()
		return
	}
	_ = ex.msg.NakWithDelay(time.Second)
}

// finishFailed ends an execution that produced no output. The key is released (FAILED,
// retryable: a retry executes again) unless an attempt may have run at the backend: that
// outcome is kept, so no copy of the intent runs it a second time. A degraded message is
// delivered as a normal result (and not kept either).
func (ex *execution) finishFailed(ctx context.Context, f *failure) {
	ex.degraded = f.degraded
	ex.pub.SetMeta(ex.meta())
	ex.pool.noteEvent(dashboard.EventFailed, ex.job.ID, ex.job.Tenant, ex.job.Model, failureReason(f))
	res := &kv.Result{Status: f.status, Body: f.body, Retryable: !f.ambiguous && ex.ambiguous == 0}
	if err := ex.writeFinal(ctx, kv.Failed, res); err != nil {
		ex.abandon(err)
		return
	}
	kind := jobs.KindError
	if f.degraded && f.status == http.StatusOK {
		kind = jobs.KindResult
	}
	announced := ex.announce(ctx, kind, f.status, f.body, f.retryAfter)
	ex.discard()
	ex.settle(announced)
}

// finishFailedAfterOutput keeps the partial output: the key is not released (a retry would
// repeat a prefix), followers get an explicit error event.
func (ex *execution) finishFailedAfterOutput(ctx context.Context, res *kv.Result) {
	if err := ex.writeFinal(ctx, kv.Failed, res); err != nil {
		ex.abandon(err)
		return
	}
	ex.announceCharged(ctx, jobs.KindError, http.StatusOK, res.Body)
}

// discard schedules the removal of this epoch's chunks: the outcome is stored and the
// terminal chunk sent, so only copies already following can still need them. A terminal chunk
// that is the subject's only one (a non-stream answer) expires by itself after the same grace:
// no purge. A request stored in REQUESTS is deleted now: nothing re-drives a finished record.
func (ex *execution) discard() {
	if ex.pool.discard != nil && !ex.pub.ExpiresAlone() {
		ex.pool.discard.Schedule(ex.job.Subject())
	}
	ex.mu.Lock()
	rec := ex.rec
	ex.mu.Unlock()
	if rec != nil {
		ex.pool.dropRequest(ex.job.Key, rec, ex.log)
	}
}

// chargeFinal charges the outcome this worker stored.
func (ex *execution) chargeFinal() {
	ex.mu.Lock()
	rec, rev := ex.rec, ex.rev
	ex.mu.Unlock()
	if rec != nil && ex.pool.charge(context.Background(), ex.job.Key, rec, rev, ex.job.Body, false) && !ex.unrecorded {
		ex.pool.noteCharged(ex.job.Key, rev) // the charge sweep need not read this record
	}
}

// abandon stops after losing the record (fenced) or failing to write: the job is not acked,
// so if we still own it the lease lapses and another worker takes over.
func (ex *execution) abandon(err error) {
	if errors.Is(err, kv.ErrConflict) || errors.Is(err, jobs.ErrFenced) || errors.Is(err, errFenced) {
		if !errors.Is(err, errFenced) { // errFenced: a refusal already counted (the renewal's)
			ex.pool.opts.Metrics.FencedWrite()
		}
		ex.log.Warn().Err(err).Msg("fenced: execution taken over; stopping without further writes")
		ex.chargeCancelled()
		_ = ex.msg.Ack()
		return
	}
	ex.log.Error().Err(err).Msg("execution abandoned; the lease will lapse and the job be taken over")
}

// finalMargin is how long before the lease ends the record writes stop retrying (a quarter of
// a shorter lease): past it, another worker may take the execution over (the revision fences
// any later write anyway).
const finalMargin = time.Second

// leaseLeft is how long the record's writes may still be retried: until the lease (in the
// pool's clock) ends, less the margin; as a deadline on the wall clock, which the retries use.
// One whole try is always allowed, as before retries: the revision makes a late write safe.
func (ex *execution) leaseLeft() time.Time {
	if ex.rec.LeaseUntil.IsZero() {
		return time.Now().Add(jsretry.Window)
	}
	margin := min(finalMargin, ex.pool.opts.Lease/4)
	left := ex.rec.LeaseUntil.Sub(ex.pool.opts.Now()) - margin
	return time.Now().Add(max(left, jsretry.PerTry))
}

// finalRetry is the least time a finished outcome's write is retried, whatever the lease: a
// server restart and the election after it (up to 15 s in the fault suite's row 3a) can
// outlast a short lease, and nobody can take the execution over while the store is
// unavailable anyway. A write past the lease is safe: it expects the revision this worker
// holds, so a taker's write fences it.
const finalRetry = 30 * time.Second

// finalDeadline is until when the outcome's write is retried: the lease, and at least
// finalRetry.
func (ex *execution) finalDeadline() time.Time {
	until, least := ex.leaseLeft(), time.Now().Add(finalRetry)
	if until.After(least) {
		return until
	}
	return least
}

// writeFinal stores the outcome. A finished answer is never thrown away for one failed write:
// a transient NATS failure (an election, a reconnect) is retried with the same expected
// revision while the lease lasts, and at least finalRetry; only a conflict (fenced) or that
// deadline ends it.
func (ex *execution) writeFinal(ctx context.Context, state kv.State, res *kv.Result) error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.rec == nil {
		return errFenced
	}
	finish := ex.rec.Completed
	if state == kv.Failed {
		finish = ex.rec.Failed
	}
	next := finish(ex.pool.opts.Now(), res, ex.done())
	if err := ex.update(ctx, next, ex.finalDeadline()); err != nil {
		if errors.Is(err, kv.ErrConflict) {
			ex.rec = nil
		}
		return fmt.Errorf("workers: finish %s: %w", ex.job.ID, err)
	}
	ex.pool.opts.Metrics.Execution(ex.answeredBy(), state == kv.Completed)
	ex.finishGenAI(ctx, state, res)
	return nil
}

// update writes next over the record at ex.rev (ex.mu held), retrying transient failures
// until until. A write that failed unavailable may have landed after all, so the next
// write's conflict may be against our own record: it is checked (kv.Landed, then ownRecord)
// before concluding we were fenced.
func (ex *execution) update(ctx context.Context, next *kv.Record, until time.Time) error {
	if ex.unrecorded { // the record lives in this execution only
		ex.rec, ex.rev = next, ex.rev+1
		return nil
	}
	for {
		rev, err := ex.pool.store.UpdateBefore(ctx, ex.job.Key, next, ex.rev, until)
		if !errors.Is(err, kv.ErrConflict) {
			switch {
			case err == nil:
				ex.rec, ex.rev, ex.unsure = next, rev, nil
			case errors.Is(err, kv.ErrUnavailable):
				ex.unsure = append(ex.unsure, next)
			}
			return err
		}
		if len(ex.unsure) > 0 {
			landed, lrev, lerr := ex.landed(ctx)
			switch {
			case errors.Is(lerr, kv.ErrNotLanded):
				// The leader still has the record at ex.rev: the conflict came from a server that
				// holds an earlier write pending (a partition healed). None is lost yet: keep them
				// and try next again until until.
				if err := pause(ctx, notLandedPause, until); err != nil {
					return fmt.Errorf("%w: %w", kv.ErrUnavailable, lerr) // undecided, not fenced
				}
				continue
			case lerr == nil:
				ex.log.Info().Msg("an earlier record write whose answer was lost had landed")
				ex.rec, ex.rev, ex.unsure = landed, lrev, nil
				continue
			case !errors.Is(lerr, kv.ErrConflict):
				return lerr // undecided: nothing learned, ex.unsure stays
			}
		}
		cur, crev, ok, rerr := ex.ownRecord(ctx)
		if rerr != nil {
			// Undecided: no read past ex.rev yet (a replica behind its leader, or none). Not
			// fenced until a read says so: try the write again.
			if err := pause(ctx, notLandedPause, until); err != nil {
				return fmt.Errorf("%w: %w", kv.ErrUnavailable, rerr)
			}
			continue
		}
		if !ok {
			ex.unsure = nil
			ex.log.Warn().Uint64("revision", crev).Int("record_epoch", cur.Epoch).Str("state", string(cur.State)).
				Str("record_worker", cur.Worker).Bool("cancelled", cur.Cancelled).Msg("the record moved on by another writer")
			return err
		}
		ex.log.Info().Uint64("revision", crev).Msg("the record moved on by a write of this execution's own; writing over it")
		ex.rec, ex.rev, ex.unsure = cur, crev, nil
	}
}

// ownRecord reads the record after a conflict that no write in ex.unsure explains, and
// reports it as this execution's own when it is past ex.rev and still PENDING in this epoch,
// naming this worker: nobody else writes such a record (a takeover moves the epoch on, a
// cancel or a release ends it), so it is a renewal of ours whose answer was lost, whatever its
// bytes. The epoch is the fence, not the revision. In the fault suite's row 3b two owners
// took such a write, landed at a partition's heal, for a taker's, cancelled their backend
// calls, and their intents were executed again. The read has its own retry window, not what
// is left of the write's: the lease may have run out while the store was unavailable, and a
// taker's write fences a late one anyway. A read that fails, or comes from a replica not yet
// past ex.rev, decides nothing (err).
func (ex *execution) ownRecord(ctx context.Context) (cur *kv.Record, rev uint64, ours bool, err error) {
	cur, rev, err = ex.pool.store.Get(ctx, ex.job.Key)
	switch {
	case err != nil:
		return nil, 0, false, err
	case rev <= ex.rev:
		return nil, 0, false, fmt.Errorf("workers: the record read is at revision %d, not past %d", rev, ex.rev)
	}
	ours = cur.State == kv.Pending && !cur.Cancelled && cur.JobID == ex.job.ID && cur.Epoch == ex.job.Epoch &&
		cur.Worker == ex.pool.opts.ID
	return cur, rev, ours, nil
}

// landed asks kv.Landed about each of ex.unsure, newest first: the one the record holds
// (with its revision), ErrNotLanded if the leader still holds ex.rev, ErrConflict if the
// record moved on without any of them, or the first undecided failure.
func (ex *execution) landed(ctx context.Context) (*kv.Record, uint64, error) {
	var undecided error
	for i := len(ex.unsure) - 1; i >= 0; i-- {
		rev, err := ex.pool.store.Landed(ctx, ex.job.Key, ex.unsure[i], ex.rev)
		switch {
		case err == nil:
			return ex.unsure[i], rev, nil
		case errors.Is(err, kv.ErrNotLanded):
			return nil, 0, err // the record did not move: the same for every one of them
		case errors.Is(err, kv.ErrConflict):
		default:
			undecided = cmp.Or(undecided, err)
		}
	}
	if undecided != nil {
		return nil, 0, undecided
	}
	return nil, 0, kv.ErrConflict
}

// notLandedPause is the wait before writing again over a record whose leader says an earlier
// write did not land while another server still refuses against it.
const notLandedPause = 100 * time.Millisecond

// pause waits d, or fails at once if ctx ends first or d would pass until.
func pause(ctx context.Context, d time.Duration, until time.Time) error {
	if time.Until(until) < d {
		return context.DeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// done is what this execution did, as its outcome stores it.
func (ex *execution) done() kv.Execution {
	return kv.Execution{Worker: ex.pool.opts.ID, Backend: ex.backend, Attempts: ex.attempts, Ambiguous: ex.ambiguous,
		Degraded: ex.degraded, Chunks: ex.pub.Next(), Tokens: int(ex.tokens.Load())}
}

// dispatched marks the record dispatched (the first attempt was sent); the next renewal or
// the outcome writes it.
func (ex *execution) dispatched() {
	ex.progress.mu.Lock()
	sent := ex.progress.cur.Sent
	ex.progress.mu.Unlock()
	ex.pool.noteAnswered(ex.backend, sent)
	ex.mu.Lock()
	if ex.rec != nil {
		ex.rec = ex.rec.Dispatched()
	}
	ex.mu.Unlock()
}

// renewLoop extends the lease by compare-and-set and keeps the job message in progress; on a
// lost CAS it cancels the execution (fencing).
func (ex *execution) renewLoop(ctx context.Context, cancel context.CancelFunc) {
	t := time.NewTicker(ex.pool.opts.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = ex.msg.InProgress()
		ex.mu.Lock()
		if ex.rec == nil || ex.rec.State != kv.Pending {
			ex.mu.Unlock()
			return
		}
		next := ex.rec.Renewed(ex.pool.opts.Now(), ex.pool.opts.Lease, ex.pool.opts.ID, ex.pub.Next(), int(ex.tokens.Load()))
		// Retried for what is left of the lease (at least one jsretry.PerTry), not only until
		// the next tick: right after an election the new leader can take longer than a tick to
		// answer, and in row 3b renewals cut at 500 ms kept timing out while a taker, whose
		// write had seconds, took the execution over. The ticker drops the ticks missed.
		err := ex.update(ctx, next, ex.leaseLeft())
		if err == nil {
			ex.mu.Unlock()
			continue
		}
		ex.pool.opts.Metrics.LeaseRenewalFailed()
		if errors.Is(err, kv.ErrConflict) {
			ex.rec = nil
			ex.mu.Unlock()
			ex.pool.opts.Metrics.FencedWrite()
			ex.log.Warn().Msg("lease lost (record changed); cancelling the backend call")
			cancel()
			ex.chargeCancelled()
			return
		}
		ex.mu.Unlock()
		// The server says which side of a partition the owner is on.
		ex.log.Warn().Err(err).Str("server", ex.pool.js.Conn().ConnectedServerName()).Msg("lease renewal failed; will retry")
	}
}
