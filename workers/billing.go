package workers

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

// Ledger is where a worker charges the executions it completed.
type Ledger interface {
	Charge(ctx context.Context, c ledger.ChargeInput) (ledger.Entry, error)
	Continuation(ctx context.Context, chargeID string, c ledger.ChargeInput) (ledger.Entry, error)
}

// charge writes the ledger entries of an execution whose outcome this worker stored (its
// compare-and-set on the record succeeded: a fenced worker never gets here). It runs after
// the client was answered and before the job is acked, so a crash in between is repaired by
// the redelivery (handle charges a finished record again), and entry ids are deterministic: a
// charge written twice is one charge. repeat marks that redelivery: the charge may already be
// in the ledger, written after the outcome was stored, however long ago that was.
func (p *Pool) charge(ctx context.Context, key string, rec *kv.Record, rev uint64, request []byte, repeat bool) {
	if p.opts.Ledger == nil || rec.Result == nil || rec.Result.Attempts == 0 {
		return
	}
	res := rec.Result
	if res.Status != 200 && !res.Partial { // a refusal or a client error produced no billable output
		return
	}
	in := ledger.ChargeInput{Tenant: rec.Tenant, KeyHash: key, JobID: rec.JobID, Epoch: rec.Epoch, Attempt: res.Attempts,
		Model: rec.Model, Backend: res.Backend, Completed: rec.State == kv.Completed, Fence: rev}
	if repeat {
		in.After = res.Finished
	}
	switch u := res.Usage; {
	case u != nil && len(res.ContinuationUsage) == 0:
		in.InputTokens, in.OutputTokens = u.PromptTokens, u.CompletionTokens
	case u != nil:
		// The first attempt's own usage never arrived (its stream broke); the answer's usage
		// is its prefix plus the continuations': take the continuations' out.
		out := u.CompletionTokens
		for _, cu := range res.ContinuationUsage {
			out -= cu.CompletionTokens
		}
		in.InputTokens, in.OutputTokens, in.Estimated = u.PromptTokens, max(out, 0), true
	case len(res.Events) > 0: // a stream without usage: one content event per token
		in.InputTokens, in.OutputTokens, in.Estimated = ledger.EstimateTokens(request), rec.Tokens, true
	default:
		in.InputTokens, in.OutputTokens, in.Estimated = ledger.EstimateTokens(request), ledger.EstimateTokens(res.Body), true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	entry, err := p.opts.Ledger.Charge(ctx, in)
	if err != nil {
		p.opts.Log.Error().Err(err).Str(fieldJobID, rec.JobID).Str(fieldKey, key).Msg("ledger charge failed; the redelivered job will retry it")
		return
	}
	for i, cu := range res.ContinuationUsage {
		c := in
		c.Attempt, c.InputTokens, c.OutputTokens, c.Estimated = i+1, cu.PromptTokens, cu.CompletionTokens, false
		if _, err := p.opts.Ledger.Continuation(ctx, entry.ID, c); err != nil {
			p.opts.Log.Error().Err(err).Str(fieldJobID, rec.JobID).Msg("ledger continuation charge failed")
		}
	}
}
