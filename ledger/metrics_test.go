package ledger_test

import (
	"testing"

	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/ledger"
)

// TestLedgerMetrics: the spend counter adds what each appended charge costs (a repeated
// charge, which appends nothing, adds nothing), and reconciling an intent charged twice counts
// one duplicate execution and one reversal, once however many reconcilers run.
func TestLedgerMetrics(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	m := telemetry.New(telemetry.Labels{Tenants: []string{"acme"}, Models: []string{"gpt-4o-mini"}})
	l := ledger.New(srv.JS, testPrices, "USD", ledger.WithMetrics(m))
	for _, epoch := range []int{1, 2, 2} { // epoch 2 twice: one charge id, appended once
		if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k3, JobID: j3, Epoch: epoch, Attempt: 1, Model: "gpt-4o-mini",
			InputTokens: 900, OutputTokens: 400, Completed: epoch == 2}); err != nil {
			t.Fatal(err)
		}
	}
	acme := map[string]string{"tenant": "acme", "model": "gpt-4o-mini"}
	if got, want := m.Value("oncegate_spend_micros_total", acme), float64(2*testPrices.Cost("gpt-4o-mini", 900, 400)); got != want {
		t.Fatalf("spend %v, want %v (two charges appended)", got, want)
	}
	for range 2 {
		if _, err := l.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, js := srv.Conn(t) // another process's reconciler finds the reversal written
	if _, err := ledger.New(js, testPrices, "USD", ledger.WithMetrics(m)).Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.Value("oncegate_duplicate_executions_total", nil); got != 1 {
		t.Errorf("duplicate executions %v, want 1", got)
	}
	if got := m.Value("oncegate_ledger_reversals_total", map[string]string{"tenant": "acme"}); got != 1 {
		t.Errorf("reversals %v, want 1", got)
	}
}
