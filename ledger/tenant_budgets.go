package ledger

import "context"

// BudgetLimit is one tenant's spend limit: at most Micros of net spend per Period.
type BudgetLimit struct {
	Period Period
	Micros int64
}

// TenantBudgets routes each tenant to the Budgets of its limit's period; a tenant without a
// limit passes. It is the budget admission of the intent core (intent.Budgeter). It is
// read-only once built, so as safe for concurrent use as the Budgets it holds.
type TenantBudgets map[string]*Budgets

// NewTenantBudgets builds one Budgets per period over l's entries, each enforcing the limits
// of that period's tenants, all feeding and asking one Outputs (Admit). An unknown period is
// ErrInvalid.
func NewTenantBudgets(l *Ledger, limits map[string]BudgetLimit) (TenantBudgets, error) {
	return tenantBudgets(&Set{parts: []*Ledger{l}}, limits)
}

// tenantBudgets is NewTenantBudgets over the ledgers of s.
func tenantBudgets(s *Set, limits map[string]BudgetLimit) (TenantBudgets, error) {
	outputs := NewOutputs()
	byPeriod := map[Period]map[string]int64{}
	for tenant, lim := range limits {
		if byPeriod[lim.Period] == nil {
			byPeriod[lim.Period] = map[string]int64{}
		}
		byPeriod[lim.Period][tenant] = lim.Micros
	}
	out := TenantBudgets{}
	for p, lim := range byPeriod {
		b, err := newBudgets(s, p, lim, WithOutputs(outputs))
		if err != nil {
			return nil, err
		}
		for tenant := range lim {
			out[tenant] = b
		}
	}
	return out, nil
}

// ReserveJob admits estimateMicros for job jobID against the tenant's budget, if it has one
// (Budgets.ReserveJob); a tenant without one passes.
func (tb TenantBudgets) ReserveJob(ctx context.Context, tenant, jobID string, estimateMicros int64) (func(int64), error) {
	if b, ok := tb[tenant]; ok {
		return b.ReserveJob(ctx, tenant, jobID, estimateMicros)
	}
	return func(int64) {}, nil
}

// Admit admits ask against the tenant's budget, if it has one (Budgets.Admit); a tenant
// without one passes, reserving nothing.
func (tb TenantBudgets) Admit(ctx context.Context, tenant string, ask Ask) (int64, func(int64), error) {
	if b, ok := tb[tenant]; ok {
		return b.Admit(ctx, tenant, ask)
	}
	return 0, func(int64) {}, nil
}
