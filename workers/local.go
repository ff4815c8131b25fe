package workers

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// RunLocal runs the execution of job, whose record rec was never stored, in this process for
// the one client that follows it through out's feed: a request that opted out of
// deduplication, admitted on this node (intent.LocalRunner). It is the job path's execution
// (the same retries, fallbacks, breakers and first-token resend) without a job message, record
// writes, lease renewals or progress; its ledger charge is written before its terminal chunk.
// It takes one of the pool's slots (shared with JOBS, Options.Concurrency) and reports false,
// having started nothing, when none is free or the pool is not running: the caller submits the
// job instead. Like every execution, it runs to its end when its client leaves, and Run waits
// for it at shutdown.
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
	log := p.opts.Log.With().Str(fieldJobID, job.ID).Str(fieldKey, job.Key).Bool("local", true).Logger()
	ex := &execution{pool: p, job: job, msg: noMessage{}, pub: out, unrecorded: true, rec: rec, log: log}
	p.localWG.Add(1)
	go func() {
		defer p.localWG.Done()
		defer func() { <-p.slots }()
		p.execute(ctx, ex)
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
