package ledger_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/ledger"
)

// TestBudgetAdmit: Admit prices a request with the ledger's prices once the tenant's entries
// are read: its max_tokens when it sets one, else the most the model's recent answers returned
// (learned from the entries read, so a node's first request of a tenant already has them), else
// the default. A refusal below the limit is ErrBudgetNoFit and says how the output was sized and
// the max_tokens that fits; one at the limit is ErrBudgetExceeded alone.
func TestBudgetAdmit(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	clock := &manualClock{t: time.Date(2026, 5, 2, 9, 0, 0, 0, time.UTC)}
	// 1 µ an input token, 2 µ an output token: an answer of 10 in and 16 out costs 42 µ.
	l := ledger.New(srv.JS, ledger.Prices{"*": {InputPerMillion: 1_000_000, OutputPerMillion: 2_000_000}}, "USD", ledger.WithClock(clock.Now))
	const def = 1024 // ledger.default_max_tokens

	type want struct {
		reserved int64
		err      error // nil, ErrBudgetNoFit or ErrBudgetExceeded (then not ErrBudgetNoFit)
		from     string
		out, fit int
	}
	cases := []struct {
		name    string
		answers int   // completed answers of the case's model in the ledger: 10 in, 16 out
		limit   int64 // µ a day
		in, max int   // the request's input tokens and max_tokens (0: none)
		want    want
	}{
		{"recent answers size a request without max_tokens", ledger.OutputMinAnswers, 1000, 10, 0, want{reserved: 42}},
		{"max_tokens sizes it", ledger.OutputMinAnswers, 1000, 10, 100, want{reserved: 210}},
		{"too few answers: the default", ledger.OutputMinAnswers - 1, 1000, 10, 0,
			want{err: ledger.ErrBudgetNoFit, from: ledger.OutputFromDefault, out: def, fit: (1000 - 7*42 - 10) / 2}},
		{"the default fits", 0, 10_000, 10, 0, want{reserved: 10 + 2*def}},
		{"recent answers do not fit below the limit", ledger.OutputMinAnswers, 8*42 + 34, 10, 0,
			want{err: ledger.ErrBudgetNoFit, from: ledger.OutputFromRecent, out: 16, fit: 12}},
		{"max_tokens does not fit below the limit", ledger.OutputMinAnswers, 8*42 + 34, 10, 13,
			want{err: ledger.ErrBudgetNoFit, from: ledger.OutputFromMaxTokens, out: 13, fit: 12}},
		{"its input leaves no room", ledger.OutputMinAnswers, 8*42 + 4, 10, 0,
			want{err: ledger.ErrBudgetNoFit, from: ledger.OutputFromRecent, out: 16, fit: 0}},
		{"the limit is reached", ledger.OutputMinAnswers, 8 * 42, 10, 1, want{err: ledger.ErrBudgetExceeded}},
	}
	limits := map[string]ledger.BudgetLimit{}
	for i, tc := range cases {
		tenant, model := fmt.Sprintf("t%d", i), fmt.Sprintf("m%d", i)
		limits[tenant] = ledger.BudgetLimit{Period: ledger.PeriodDay, Micros: tc.limit}
		for a := range tc.answers {
			if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: tenant, KeyHash: fmt.Sprintf("k%d-%d", i, a), JobID: j1, Epoch: 1, Model: model,
				InputTokens: 10, OutputTokens: 16, Completed: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A node started after the charges: its estimates come from its budgets' first reads.
	tbs, err := ledger.NewTenantBudgets(l, limits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, b := range tbs {
			b.Close()
		}
	})
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tenant, model := fmt.Sprintf("t%d", i), fmt.Sprintf("m%d", i)
			reserved, release, err := tbs.Admit(ctx, tenant, ledger.Ask{JobID: j2, Model: model, InputTokens: tc.in, MaxTokens: tc.max, DefaultMaxTokens: def})
			if tc.want.err == nil {
				if err != nil || reserved != tc.want.reserved {
					t.Fatalf("Admit = %d, %v; want %d reserved", reserved, err, tc.want.reserved)
				}
				release(reserved)
				return
			}
			var be *ledger.BudgetError
			if !errors.Is(err, tc.want.err) || !errors.As(err, &be) {
				t.Fatalf("Admit = %d, %v; want a *BudgetError matching %v", reserved, err, tc.want.err)
			}
			if tc.want.err == ledger.ErrBudgetExceeded {
				if errors.Is(err, ledger.ErrBudgetNoFit) {
					t.Fatalf("at the limit: %v matches ErrBudgetNoFit", err)
				}
				return
			}
			if !errors.Is(err, ledger.ErrBudgetExceeded) || be.OutputFrom != tc.want.from || be.OutputTokens != tc.want.out || be.FitMaxTokens != tc.want.fit {
				t.Fatalf("refusal %+v: want it to match ErrBudgetExceeded, output from %s, %d tokens, %d fit", be, tc.want.from, tc.want.out, tc.want.fit)
			}
		})
	}
}
