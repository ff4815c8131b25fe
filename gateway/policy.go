package gateway

import (
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/ledger"
)

// The configuration's policies in the terms of the rooms that apply them. They live here, not
// in those rooms: ledger is kept from internal/config (internal/archtest), and intent takes its
// settings as its own types (Options, Limits), as every room below the gateway does.

// prices is the configured price table (micro-units per million tokens) as the ledger's.
func prices(l config.Ledger) ledger.Prices {
	p := ledger.Prices{}
	for m, pr := range l.Prices {
		p[m] = ledger.Price{InputPerMillion: pr.InputPerMillion, OutputPerMillion: pr.OutputPerMillion}
	}
	return p
}

// budgetLimits is the spend limit of every tenant that has one (ledger.NewTenantBudgets).
func budgetLimits(tenants []config.Tenant) map[string]ledger.BudgetLimit {
	m := map[string]ledger.BudgetLimit{}
	for _, t := range tenants {
		if t.Budget != nil {
			m[t.ID] = ledger.BudgetLimit{Period: ledger.Period(t.Budget.Period), Micros: t.Budget.Limit}
		}
	}
	return m
}

// tenantLimits is this node's share of every tenant's caps (config.Limits.Share).
func tenantLimits(cfg *config.Config) map[string]intent.Limits {
	m := map[string]intent.Limits{}
	for _, t := range cfg.Tenants {
		l := t.Limits.Share(cfg.Admission.APINodes)
		m[t.ID] = intent.Limits{Executions: l.Executions, Streams: l.Streams, FollowersPerJob: l.FollowersPerJob,
			RequestsPerSecond: l.RequestsPerSecond, Burst: l.Burst, TokensPerMinute: l.TokensPerMinute}
	}
	return m
}
