package gateway

import (
	"reflect"
	"testing"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/ledger"
)

// TestPrices: every configured model's prices reach the ledger, input and output apart.
func TestPrices(t *testing.T) {
	got := prices(config.Ledger{Prices: map[string]config.Price{
		"m1": {InputPerMillion: 150, OutputPerMillion: 600},
		"m2": {InputPerMillion: 3, OutputPerMillion: 0},
	}})
	want := ledger.Prices{"m1": {InputPerMillion: 150, OutputPerMillion: 600}, "m2": {InputPerMillion: 3}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("prices = %+v, want %+v", got, want)
	}
	if got := prices(config.Ledger{}); got == nil || len(got) != 0 {
		t.Errorf("no prices = %#v, want an empty table", got)
	}
}

// TestBudgetLimits: tenants with a budget get its period and limit; tenants without one are
// left out (they pass every admission).
func TestBudgetLimits(t *testing.T) {
	got := budgetLimits([]config.Tenant{
		{ID: "a", Budget: &config.Budget{Limit: 5_000_000, Period: "day"}},
		{ID: "b"},
		{ID: "c", Budget: &config.Budget{Limit: 7, Period: "month"}},
	})
	want := map[string]ledger.BudgetLimit{"a": {Period: ledger.PeriodDay, Micros: 5_000_000}, "c": {Period: ledger.PeriodMonth, Micros: 7}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("budgetLimits = %+v, want %+v", got, want)
	}
}

// TestTenantLimits: each tenant gets this node's share of each of its caps, every cap carried.
func TestTenantLimits(t *testing.T) {
	caps := config.Limits{Executions: 10, Streams: 8, FollowersPerJob: 6, RequestsPerSecond: 4, Burst: 12, TokensPerMinute: 1000}
	tests := []struct {
		name  string
		nodes int
		want  intent.Limits
	}{
		{"one node", 1, intent.Limits{Executions: 10, Streams: 8, FollowersPerJob: 6, RequestsPerSecond: 4, Burst: 12, TokensPerMinute: 1000}},
		{"two nodes", 2, intent.Limits{Executions: 5, Streams: 4, FollowersPerJob: 3, RequestsPerSecond: 2, Burst: 6, TokensPerMinute: 500}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{Tenants: []config.Tenant{{ID: "a", Limits: caps}, {ID: "free"}}}
			cfg.Admission.APINodes = tt.nodes
			got := tenantLimits(cfg)
			want := map[string]intent.Limits{"a": tt.want, "free": {}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("tenantLimits = %+v, want %+v", got, want)
			}
		})
	}
}
