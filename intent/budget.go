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
}

// cancel gives back everything of an execution that never ran (its claim or publish failed).
func (r *reservation) cancel() {
	r.unspend()
	r.unstream()
	r.settle(0)
}

// reserve admits a new execution against the node's bounds (shed.go), the tenant's caps
// (limits.go) and its budget (replays and joins never come here); ErrOverloaded without room,
// a *LimitError above a cap, ledger.ErrBudgetExceeded when the spend limit is reached.
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
	release, err := c.budgets.ReserveJob(ctx, req.Tenant, jobID, c.estimate(req))
	if errors.Is(err, ledger.ErrBudgetExceeded) {
		c.metrics.BudgetRefused(req.Tenant)
	}
	if err != nil {
		r.cancel()
		return nil, fmt.Errorf("intent: budget of %s: %w", req.Tenant, err)
	}
	places := r.settle
	r.settle = func(actual int64) {
		release(actual)
		places(actual)
	}
	return r, nil
}

// estimate is what a new execution of req may cost: the price of its input (4 bytes a token)
// and of its max_tokens (or the configured default).
func (c *Core) estimate(req *Request) int64 {
	return c.prices.Cost(req.Model, ledger.EstimateTokens(req.Body), c.maxOut(req))
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
