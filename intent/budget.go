package intent

import (
	"context"
	"errors"
	"fmt"

	"github.com/oncegate/oncegate/ledger"
)

// reservation is what a new execution holds from admission to its answer: its places under
// the node's bounds and the tenant's caps, its tokens of the tenant's tokens per minute, its
// budget reservation, and for a streamed answer one of the tenant's streams.
type reservation struct {
	settle   func(actualMicros int64) // the places and the budget, once the answer is delivered
	unspend  func()                   // the tokens, only for an execution that never ran
	unstream func()                   // the stream, once delivered
	budget   int64                    // the budget reserved (micro-units), for the settle hold
}

// cancel gives back everything of an execution that never ran (its claim or publish failed).
func (r *reservation) cancel() {
	r.unspend()
	r.unstream()
	r.settle(0)
}

// reserve admits a new execution against the node's bounds (shed.go), the tenant's caps
// (limits.go) and its budget (replays and joins never come here); ErrOverloaded without room,
// a *LimitError above a cap, ledger.ErrBudgetExceeded when the request's estimate does not fit
// under the spend limit (ledger.ErrBudgetNoFit too while the spend is below it).
func (c *Core) reserve(ctx context.Context, req *Request, jobID string) (*reservation, error) {
	free, err := c.slot(len(req.Body))
	if err != nil {
		return nil, err
	}
	lim := c.limitsOf(req.Tenant)
	unexec, err := lim.execution()
	if err != nil {
		free()
		return nil, err
	}
	r := &reservation{settle: func(int64) { unexec(); free() }, unspend: func() {}, unstream: func() {}}
	if r.unspend, err = lim.spendTokens(c.now(), c.estimateTokens(req)); err != nil {
		r.unspend = func() {}
		r.cancel()
		return nil, err
	}
	if req.Stream && !req.Async {
		if r.unstream, err = lim.stream(); err != nil {
			r.unstream = func() {}
			r.cancel()
			return nil, err
		}
	}
	if c.budgets == nil {
		return r, nil
	}
	reserved, release, err := c.budgets.Admit(ctx, req.Tenant, ledger.Ask{JobID: jobID, Model: req.Model,
		InputTokens: ledger.EstimateTokens(req.Body), MaxTokens: req.MaxTokens, DefaultMaxTokens: c.opts.DefaultMaxTokens})
	if errors.Is(err, ledger.ErrBudgetExceeded) {
		c.metrics.BudgetRefused(req.Tenant)
	}
	if err != nil {
		r.cancel()
		return nil, fmt.Errorf("intent: budget of %s: %w", req.Tenant, err)
	}
	places := r.settle
	r.budget = reserved
	r.settle = func(actual int64) {
		release(actual)
		places(actual)
	}
	return r, nil
}

// estimateTokens is how many tokens a new execution of req may use: its input (4 bytes a
// token) and its max_tokens (or the configured default).
func (c *Core) estimateTokens(req *Request) int {
	return ledger.EstimateTokens(req.Body) + c.maxOut(req)
}

func (c *Core) maxOut(req *Request) int {
	if req.MaxTokens > 0 {
		return req.MaxTokens
	}
	return c.opts.DefaultMaxTokens
}
