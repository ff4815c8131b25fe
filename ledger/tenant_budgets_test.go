package ledger_test

import (
	"errors"
	"testing"

	"github.com/oncegate/oncegate/ledger"
)

// TestTenantBudgets: each tenant is held to the limit of its own period (tenants of one
// period share one Budgets), a tenant without a limit passes any estimate, and an unknown
// period is refused when built.
func TestTenantBudgets(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, ledger.Prices{}, "USD")
	tb, err := ledger.NewTenantBudgets(l, map[string]ledger.BudgetLimit{
		"daily":   {Period: ledger.PeriodDay, Micros: 10},
		"daily2":  {Period: ledger.PeriodDay, Micros: 10},
		"monthly": {Period: ledger.PeriodMonth, Micros: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, b := range tb {
			b.Close()
		}
	})
	if len(tb) != 3 || tb["daily"] != tb["daily2"] || tb["daily"] == tb["monthly"] {
		t.Fatalf("routing %v: want the two daily tenants on one Budgets, the monthly one on another", tb)
	}
	if _, err := tb.ReserveJob(ctx, "daily", "j-day", 20); !errors.Is(err, ledger.ErrBudgetExceeded) {
		t.Errorf("daily tenant, 20 over a limit of 10: %v, want ErrBudgetExceeded", err)
	}
	release, err := tb.ReserveJob(ctx, "monthly", "j-month", 20)
	if err != nil {
		t.Fatalf("monthly tenant, 20 within 1000: %v", err)
	}
	release(20)
	release, err = tb.ReserveJob(ctx, "unlimited", "j-free", 1<<40)
	if err != nil {
		t.Fatalf("a tenant without a limit was refused: %v", err)
	}
	release(1 << 40)

	if _, err := ledger.NewTenantBudgets(l, map[string]ledger.BudgetLimit{"x": {Period: "week", Micros: 1}}); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("period week: %v, want ErrInvalid", err)
	}
}
