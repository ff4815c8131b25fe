package workers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// maxBackendBody bounds a non-stream backend response (and error bodies).
const maxBackendBody = 16 << 20

// coalesceBytes caps one data chunk: events already read from the socket are batched up to it.
const coalesceBytes = 16 << 10

var nullUsageField = []byte(`,"usage":null`)

// errFenced means this worker lost its record (lease taken over or job cancelled).
var errFenced = errors.New("workers: fenced")

// execution is one epoch of one job on this worker.
type execution struct {
	pool *Pool
	job  *jobs.Job
	msg  jetstream.Msg
	log  zerolog.Logger
	pub  *jobs.Publisher

	mu  sync.Mutex // guards rec and rev: the renewer and the main flow both write the record
	rec *kv.Record
	rev uint64
	// tokens counts output events published (≈ tokens), for progress in the record.
	tokens atomic.Int64
}

func (ex *execution) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ex.pub = jobs.NewPublisher(ex.pool.js, ex.job)
	backend, ok := ex.pool.opts.Backends[ex.job.Backend]
	if !ok {
		ex.finishFailed(ctx, http.StatusBadGateway, openaiwire.ErrorBody("backend "+ex.job.Backend+" is not configured on this worker", "server_error", "backend_unavailable", ""), true)
		return
	}
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		ex.renewLoop(ctx, cancel)
	}()
	defer func() {
		cancel()
		<-renewDone
	}()

	resp, cancelCall, err := backend.ChatCompletions(ctx, ex.job.Body, ex.job.Stream)
	if err != nil {
		if ctx.Err() != nil {
			return // fenced or shutting down: the new owner answers
		}
		ex.log.Warn().Err(err).Msg("backend call failed before a response")
		ex.finishFailed(ctx, http.StatusBadGateway, openaiwire.ErrorBody("the model backend could not be reached", "server_error", "backend_unreachable", ""), true)
		return
	}
	defer cancelCall()
	defer resp.Body.Close()
	ex.setProgress(kv.ProgressDispatched)

	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBackendBody))
		if retryableStatus(resp.StatusCode) {
			ex.log.Warn().Int("status", resp.StatusCode).Msg("backend refused; key released")
			ex.finishFailed(ctx, resp.StatusCode, body, true)
			return
		}
		// A 4xx that will fail the same way again is the outcome: stored and replayed.
		ex.finishCompleted(ctx, &kv.Result{Status: resp.StatusCode, Body: body}, jobs.KindResult)
		return
	}
	if !ex.job.Stream {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxBackendBody))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			ex.finishFailed(ctx, http.StatusBadGateway, openaiwire.ErrorBody("the model backend's response was cut off", "server_error", "backend_truncated", ""), true)
			return
		}
		res := &kv.Result{Status: http.StatusOK, Body: body}
		if u := openaiwire.UsageOf(body); u != nil {
			res.Usage = &kv.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		}
		ex.finishCompleted(ctx, res, jobs.KindResult)
		return
	}
	ex.stream(ctx, resp.Body)
}

// stream relays SSE events as chunks, coalescing what one socket read delivered.
func (ex *execution) stream(ctx context.Context, body io.Reader) {
	er := openaiwire.NewEventReader(body)
	// The gateway asked the backend for usage; a client that did not ask must not see the
	// "usage":null the backend then adds to every chunk.
	stripNullUsage := !openaiwire.AsksUsage(ex.job.Body)
	var all, pending, usageFrame []byte
	var usage *openaiwire.Usage
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		err := ex.pub.Publish(ctx, jobs.KindData, 0, pending)
		pending = nil
		return err
	}
	for {
		data, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if ferr := flush(); ferr != nil {
				ex.abandon(ferr)
				return
			}
			ex.log.Warn().Err(err).Int("chunks", ex.pub.Next()).Msg("backend stream broke")
			if len(all) == 0 {
				ex.finishFailed(ctx, http.StatusBadGateway, openaiwire.ErrorBody("the model backend's stream ended before any output", "server_error", "backend_truncated", ""), true)
				return
			}
			res := &kv.Result{Status: http.StatusOK, Events: all, Partial: true,
				Body: openaiwire.ErrorBody("the model backend's stream broke after partial output; not retried to avoid a repeated prefix", "server_error", "stream_interrupted", "")}
			ex.finishFailedAfterOutput(ctx, res)
			return
		}
		if u, ok := openaiwire.UsageOnly(data); ok {
			if err := flush(); err != nil {
				ex.abandon(err)
				return
			}
			usage, usageFrame = u, openaiwire.Frame(data)
			if err := ex.pub.Publish(ctx, jobs.KindUsage, 0, usageFrame); err != nil {
				ex.abandon(err)
				return
			}
			continue
		}
		ex.tokens.Add(1)
		if stripNullUsage {
			data = bytes.Replace(data, nullUsageField, nil, 1)
		}
		start := len(all)
		all = openaiwire.AppendFrame(all, data)
		pending = all[start:len(all):len(all)]
		if len(pending) < coalesceBytes && er.Buffered() {
			continue
		}
		if err := flush(); err != nil {
			ex.abandon(err)
			return
		}
	}
	if err := flush(); err != nil {
		ex.abandon(err)
		return
	}
	res := &kv.Result{Status: http.StatusOK, Events: all, UsageEvent: usageFrame}
	if usage != nil {
		res.Usage = &kv.Usage{PromptTokens: usage.PromptTokens, CompletionTokens: usage.CompletionTokens, TotalTokens: usage.TotalTokens}
	}
	ex.finishCompleted(ctx, res, jobs.KindDone)
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
	if err := ex.pub.Publish(ctx, terminal, res.Status, payload); err != nil {
		ex.log.Warn().Err(err).Msg("publishing terminal chunk; followers will read the record")
	}
	_ = ex.msg.Ack()
}

// finishFailed ends an execution that produced no output; retryable releases the key.
func (ex *execution) finishFailed(ctx context.Context, status int, body []byte, retryable bool) {
	res := &kv.Result{Status: status, Body: body, Retryable: retryable}
	if err := ex.writeFinal(ctx, kv.Failed, res); err != nil {
		ex.abandon(err)
		return
	}
	if err := ex.pub.Publish(ctx, jobs.KindError, status, body); err != nil {
		ex.log.Warn().Err(err).Msg("publishing error chunk")
	}
	_ = ex.msg.Ack()
}

// finishFailedAfterOutput keeps the partial output: the key is not released (a retry would
// repeat a prefix), followers get an explicit error event.
func (ex *execution) finishFailedAfterOutput(ctx context.Context, res *kv.Result) {
	if err := ex.writeFinal(ctx, kv.Failed, res); err != nil {
		ex.abandon(err)
		return
	}
	if err := ex.pub.Publish(ctx, jobs.KindError, http.StatusOK, res.Body); err != nil {
		ex.log.Warn().Err(err).Msg("publishing error chunk")
	}
	_ = ex.msg.Ack()
}

// abandon stops after losing the record (fenced) or failing to write: the job is not acked,
// so if we still own it the lease lapses and another worker takes over.
func (ex *execution) abandon(err error) {
	if errors.Is(err, kv.ErrConflict) || errors.Is(err, jobs.ErrFenced) || errors.Is(err, errFenced) {
		ex.log.Warn().Err(err).Msg("fenced: execution taken over; stopping without further writes")
		_ = ex.msg.Ack()
		return
	}
	ex.log.Error().Err(err).Msg("execution abandoned; the lease will lapse and the job be taken over")
}

func (ex *execution) writeFinal(ctx context.Context, state kv.State, res *kv.Result) error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.rec == nil {
		return errFenced
	}
	next := *ex.rec
	next.State = state
	res.Finished = ex.pool.opts.Now()
	next.Result = res
	next.Request = nil
	next.Progress = kv.ProgressFinished
	next.Chunks = ex.pub.Next()
	next.Tokens = int(ex.tokens.Load())
	next.LeaseUntil = time.Time{}
	next.Worker = ex.pool.opts.ID
	next.Attempts++
	rev, err := ex.pool.store.Update(ctx, ex.job.Key, &next, ex.rev)
	if err != nil {
		ex.rec = nil
		return fmt.Errorf("workers: finish %s: %w", ex.job.ID, err)
	}
	ex.rec, ex.rev = &next, rev
	return nil
}

func (ex *execution) setProgress(p string) {
	ex.mu.Lock()
	if ex.rec != nil {
		ex.rec.Progress = p
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
		next := *ex.rec
		next.LeaseUntil = ex.pool.opts.Now().Add(ex.pool.opts.Lease)
		next.Worker = ex.pool.opts.ID
		if c := ex.pub.Next(); c > 0 {
			next.Progress, next.Chunks, next.Tokens = kv.ProgressStreaming, c, int(ex.tokens.Load())
		}
		rev, err := ex.pool.store.Update(ctx, ex.job.Key, &next, ex.rev)
		if err == nil {
			ex.rec, ex.rev = &next, rev
			ex.mu.Unlock()
			continue
		}
		if errors.Is(err, kv.ErrConflict) {
			ex.rec = nil
			ex.mu.Unlock()
			ex.log.Warn().Msg("lease lost (record changed); cancelling the backend call")
			cancel()
			return
		}
		ex.mu.Unlock()
		ex.log.Warn().Err(err).Msg("lease renewal failed; will retry")
	}
}

// retryableStatus: the backend refused before doing the work, so a new attempt may succeed.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}
