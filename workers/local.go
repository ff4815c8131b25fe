package workers

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/oncegate/oncegate/internal/tracing"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// RunLocal runs the execution of job, whose record rec was never stored, in this process for
// the one client that follows it through out's feed: a request that opted out of
// deduplication, admitted on this node (intent.LocalRunner). It takes one of the pool's slots
// and reports false, having started nothing, when none is free or the pool is not running:
// the caller sends the job through JOBS instead. The execution is the job path's, without
// its record, job message, lease and progress writes: it calls the backends with the same
// retries, fallbacks and breakers, writes its chunks to out, and charges the ledger before its
// terminal chunk. Like any execution, it runs to its end when its client leaves.
func (p *Pool) RunLocal(job *jobs.Job, rec *kv.Record, out *jobs.LocalPublisher) bool {
	p.localMu.Lock()
	defer p.localMu.Unlock()
	ctx := p.localCtx
	if ctx == nil {
		return false
	}
	select {
	case p.slots <- struct{}{}:
	default:
		return false
	}
	p.localWG.Add(1)
	go func() {
		defer p.localWG.Done()
		defer func() { <-p.slots }()
		log := p.opts.Log.With().Str(fieldJobID, job.ID).Str(fieldKey, job.Key).Bool("local", true).Logger()
		ctx, span := p.opts.Tracer.StartFrom(ctx, job.Header, "oncegate.execution")
		defer span.End()
		span.SetAttributes(attribute.String("oncegate.job_id", job.ID), attribute.Bool("oncegate.local", true))
		if id := tracing.TraceID(ctx); id != "" {
			log = log.With().Str(fieldTraceID, id).Logger()
		}
		ex := &execution{pool: p, job: job, msg: noMessage{}, pub: out, local: true, rec: rec, log: log}
		p.trackStart(ex)
		defer p.trackEnd(ex)
		ex.run(ctx)
	}()
	return true
}

// openLocal lets RunLocal start executions on ctx (Run's context for executions).
func (p *Pool) openLocal(ctx context.Context) {
	p.localMu.Lock()
	defer p.localMu.Unlock()
	p.localCtx = ctx
}

// closeLocal stops RunLocal from starting executions; Run then waits for those running.
func (p *Pool) closeLocal() {
	p.localMu.Lock()
	defer p.localMu.Unlock()
	p.localCtx = nil
}

// noMessage is the job message of a local execution: there is none to settle.
type noMessage struct{}

func (noMessage) Ack() error                       { return nil }
func (noMessage) NakWithDelay(time.Duration) error { return nil }
func (noMessage) InProgress() error                { return nil }
