package ledger_test

import (
	"fmt"
	"testing"

	"github.com/oncegate/oncegate/ledger"
)

// TestOutputsEstimate: the estimate of a request without max_tokens is the most any of the
// model's last OutputWindow completed answers returned (a charge with its continuations), and
// none before OutputMinAnswers of them; what says nothing of the model's answers (attempts cut
// off, reversals, other models) is not counted.
func TestOutputsEstimate(t *testing.T) {
	charge := func(id, model string, out int) ledger.Entry {
		return ledger.Entry{ID: id, Kind: ledger.KindCharge, Model: model, OutputTokens: out, Completed: true}
	}
	answers := func(model string, outs ...int) []ledger.Entry {
		var es []ledger.Entry
		for i, n := range outs {
			es = append(es, charge(fmt.Sprintf("charge.%s.%d", model, i), model, n))
		}
		return es
	}
	same := func(n, out int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = out
		}
		return s
	}
	cat := func(parts ...[]ledger.Entry) []ledger.Entry {
		var all []ledger.Entry
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	cut := charge("charge.cut", "m", 5000)
	cut.Completed = false
	reversal := charge("reversal.x", "m", 5000)
	reversal.Kind = ledger.KindReversal
	first := answers("m", same(ledger.OutputMinAnswers, 16)...)
	cont := ledger.Entry{ID: "continuation.x", Kind: ledger.KindContinuation, Model: "m", Refers: first[3].ID, OutputTokens: 40}
	orphan := ledger.Entry{ID: "continuation.y", Kind: ledger.KindContinuation, Model: "m", Refers: "charge.gone", OutputTokens: 900}

	for _, tc := range []struct {
		name    string
		entries []ledger.Entry
		want    int
		ok      bool
	}{
		{"no answers", nil, 0, false},
		{"too few answers", answers("m", same(ledger.OutputMinAnswers-1, 16)...), 0, false},
		{"enough answers", answers("m", same(ledger.OutputMinAnswers, 16)...), 16, true},
		{"the most of them", answers("m", 10, 16, 12, 300, 14, 9, 16, 15), 300, true},
		{"an outlier leaves the window", cat(answers("m", 3000), answers("m", same(ledger.OutputWindow, 20)...)), 20, true},
		{"an outlier still in the window", cat(answers("m", 3000), answers("m", same(ledger.OutputWindow-1, 20)...)), 3000, true},
		{"a continuation adds to its answer", cat(first, []ledger.Entry{cont}), 56, true},
		{"a continuation of an answer not kept", cat(first, []ledger.Entry{orphan}), 16, true},
		{"attempts cut off and reversals", cat(first, []ledger.Entry{cut, reversal}), 16, true},
		{"other models", cat(first, answers("big", same(ledger.OutputMinAnswers, 4000)...)), 16, true},
		{"no model", cat(first, []ledger.Entry{charge("charge.nomodel", "", 4000)}), 16, true},
		{"zero output (embeddings)", answers("m", same(ledger.OutputMinAnswers, 0)...), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ledger.NewOutputs()
			for i := range tc.entries {
				o.Observe(&tc.entries[i])
			}
			got, ok := o.Estimate("m")
			if got != tc.want || ok != tc.ok {
				t.Fatalf("Estimate(m) = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	var none *ledger.Outputs // a Budgets without an estimator
	none.Observe(&first[0])
	if n, ok := none.Estimate("m"); ok || n != 0 {
		t.Fatalf("nil Outputs estimates %d, %v", n, ok)
	}
}
