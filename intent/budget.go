package intent

import (
	"context"
	"errors"
	"fmt"

	"github.com/oncegate/oncegate/ledger"
)

// reserve admits a new execution against the node's bounds (shed.go) and the tenant's budget
// (replays and joins never come here); ErrOverloaded without room, ledger.ErrBudgetExceeded
// when the limit is reached. The returned settle gives both back.
func (c *Core) reserve(ctx context.Context, req *Request) (func(int64), error) {
	free, err := c.slot()
	if err != nil {
		return nil, err
	}
	if c.budgets == nil {
		return func(int64) { free() }, nil
	}
	release, err := c.budgets.Reserve(ctx, req.Tenant, c.estimate(req))
	if errors.Is(err, ledger.ErrBudgetExceeded) {
		c.metrics.BudgetRefused(req.Tenant)
	}
	if err != nil {
		free()
		return nil, fmt.Errorf("intent: budget of %s: %w", req.Tenant, err)
	}
	return func(actual int64) {
		release(actual)
		free()
	}, nil
}

// estimate is what a new execution of req may cost: the price of its input (4 bytes a token)
// and of its max_tokens (or the configured default).
func (c *Core) estimate(req *Request) int64 {
	out := req.MaxTokens
	if out <= 0 {
		out = c.opts.DefaultMaxTokens
	}
	return c.prices.Cost(req.Model, ledger.EstimateTokens(req.Body), out)
}
