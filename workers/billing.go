package workers

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

// Ledger is where a worker charges the executions it completed.
type Ledger interface {
	Charge(ctx context.Context, c ledger.ChargeInput) (ledger.Entry, error)
	Continuation(ctx context.Context, chargeID string, c ledger.ChargeInput) (ledger.Entry, error)
}

// charge writes the ledger entries of a finished record: the charge of its outcome (and its
// continuations), and one estimated charge per unfinished epoch (attempts taken over or
// cancelled while they ran; see kv.Unfinished). It runs for an outcome this worker stored
// (after the client was answered and before the job is acked), for a redelivered job that
// finds its record finished, and from the charge sweep (chargesweep.go), which catches any
// charge a crash skipped. Entry ids are deterministic: a charge written twice is one charge.
// repeat marks the last two: the charge may already be in the ledger, written after the
// outcome was stored, however long ago that was. It reports whether every entry is in the
// ledger.
func (p *Pool) charge(ctx context.Context, key string, rec *kv.Record, rev uint64, request []byte, repeat bool) bool {
	if p.opts.Ledger == nil || !rec.Billable() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	key = rec.ChargedUnder(key) // an archived copy is charged as its original: the same ids
	ok := true
	for _, u := range rec.Unfinished {
		// The backend may have billed it; the gateway cannot ask. Its output is what the
		// progress saw (none for a non-stream attempt), its input estimated from the request.
		in := ledger.ChargeInput{Tenant: rec.Tenant, KeyHash: key, JobID: rec.JobID, Epoch: u.Epoch, Attempt: u.Attempts,
			Model: rec.Model, Backend: u.Backend, InputTokens: estimateTokens(u.RequestBytes), OutputTokens: u.Tokens,
			Estimated: true, Fence: rev}
		if repeat && rec.Result != nil {
			in.After = rec.Result.Finished
		}
		if _, err := p.opts.Ledger.Charge(ctx, in); err != nil && !errors.Is(err, ledger.ErrNoUsage) {
			p.opts.Log.Error().Err(err).Str(fieldJobID, rec.JobID).Str(fieldKey, key).Int(fieldEpoch, u.Epoch).
				Msg("ledger charge of an unfinished attempt failed; the charge sweep will retry it")
			ok = false
		}
	}
	res := rec.Result
	if res == nil || res.Attempts == 0 ||
		!((rec.State == kv.Completed && res.Status == http.StatusOK) || (rec.State == kv.Failed && res.Partial)) {
		return ok // a refusal, a client error, a cancel or a degraded answer: no billable answer
	}
	in := ledger.ChargeInput{Tenant: rec.Tenant, KeyHash: key, JobID: rec.JobID, Epoch: rec.Epoch, Attempt: res.Attempts,
		Model: rec.Model, Backend: res.Backend, Completed: rec.State == kv.Completed, Fence: rev}
	if repeat {
		in.After = res.Finished
	}
	inputEstimate := ledger.EstimateTokens(request)
	if len(request) == 0 {
		inputEstimate = estimateTokens(rec.RequestBytes) // a finished record no longer holds it
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
	case rec.API == backend.APIPassthrough: // no usage reported: the request's size, no output (an image is not tokens)
		in.InputTokens, in.Estimated = inputEstimate, true
	case len(res.Events) > 0: // a stream without usage: one content event per token
		in.InputTokens, in.OutputTokens, in.Estimated = inputEstimate, rec.Tokens, true
	default:
		in.InputTokens, in.OutputTokens, in.Estimated = inputEstimate, ledger.EstimateTokens(res.Body), true
	}
	entry, err := p.opts.Ledger.Charge(ctx, in)
	if errors.Is(err, ledger.ErrNoUsage) {
		return ok
	}
	if err != nil {
		p.opts.Log.Error().Err(err).Str(fieldJobID, rec.JobID).Str(fieldKey, key).Msg("ledger charge failed; the charge sweep will retry it")
		return false
	}
	for i, cu := range res.ContinuationUsage {
		c := in
		c.Attempt, c.InputTokens, c.OutputTokens, c.Estimated = i+1, cu.PromptTokens, cu.CompletionTokens, false
		if _, err := p.opts.Ledger.Continuation(ctx, entry.ID, c); err != nil {
			p.opts.Log.Error().Err(err).Str(fieldJobID, rec.JobID).Msg("ledger continuation charge failed; the charge sweep will retry it")
			ok = false
		}
	}
	return ok
}

// estimateTokens is ledger.EstimateTokens of a text of n bytes.
func estimateTokens(n int) int { return (max(n, 0) + 3) / 4 }
