package ledger_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/ledger"
)

// TestReconcileSummaryBoundedBySize: with a horizon, Reconcile's summary holds at most
// WithReconcileLimit intents however many the horizon spans, forgetting the intents charged
// once with the oldest charges (counted in the report); a duplicate of a recent intent is
// still reversed, one of a forgotten intent no longer is (the trade the option documents).
// Without a horizon (the `oncegate ledger reconcile` command) nothing is forgotten.
func TestReconcileSummaryBoundedBySize(t *testing.T) {
	const intents, limit = 40, 16
	for _, tc := range []struct {
		name        string
		opts        []ledger.Option
		maxIntents  int  // the summary's size after the first run, at most
		forgot      bool // the first run forgot intents early
		oldReversed bool // the oldest intent's second charge is reversed
	}{
		{name: "horizon and limit", opts: []ledger.Option{ledger.WithReconcileHorizon(48 * time.Hour), ledger.WithReconcileLimit(limit)},
			maxIntents: limit, forgot: true, oldReversed: false},
		{name: "horizon, no limit", opts: []ledger.Option{ledger.WithReconcileHorizon(48 * time.Hour), ledger.WithReconcileLimit(0)},
			maxIntents: intents, forgot: false, oldReversed: true},
		{name: "no horizon", opts: []ledger.Option{ledger.WithReconcileLimit(limit)},
			maxIntents: intents, forgot: false, oldReversed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t)
			ctx := ctxT(t)
			clock := newStepClock(time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC))
			l := ledger.New(srv.JS, testPrices, "USD", append(tc.opts, ledger.WithClock(clock.Now))...)
			job := func(i int) string { return fmt.Sprintf("01JNV6Q5M8X3Z9A4B7C2D1E%03d", i) }
			charge := func(i, epoch int) ledger.Entry {
				t.Helper()
				e, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: fmt.Sprintf("%032x", i), JobID: job(i), Epoch: epoch,
					Attempt: 1, Model: "gpt-4o-mini", InputTokens: 10, Completed: epoch == 1})
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
			for i := range intents {
				charge(i, 1)
			}
			first, err := l.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if first.Intents > tc.maxIntents || first.Entries != intents || (first.ForgottenEarly > 0) != tc.forgot {
				t.Fatalf("first run: %d intents in the summary, %d entries read, %d forgotten early; want at most %d intents, %d entries, forgotten %v",
					first.Intents, first.Entries, first.ForgottenEarly, tc.maxIntents, intents, tc.forgot)
			}
			if tc.forgot && first.Intents+first.ForgottenEarly != intents {
				t.Fatalf("first run: %d kept + %d forgotten, want %d", first.Intents, first.ForgottenEarly, intents)
			}
			newest, oldest := charge(intents-1, 2), charge(0, 2)
			second, err := l.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			reversed := map[string]bool{}
			for _, r := range second.Appended {
				reversed[r.Refers] = true
			}
			if !reversed[newest.ID] {
				t.Fatalf("the newest intent's second charge %s not reversed: %+v", newest.ID, second.Appended)
			}
			if reversed[oldest.ID] != tc.oldReversed {
				t.Fatalf("the oldest intent's second charge reversed: %v, want %v (%+v)", reversed[oldest.ID], tc.oldReversed, second.Appended)
			}
		})
	}
}
