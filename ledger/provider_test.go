package ledger_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/ledger"
)

// TestMatchProviderUsage runs the provider usage files (the same calls as CSV and JSONL) against
// the golden ledger: the duplicate execution's two calls were reversed (absorbed), a retried
// call of k1 the ledger never charged is uncharged, a line with the provider's own request id
// matches by model and tokens, and one line matches nothing.
func TestMatchProviderUsage(t *testing.T) {
	entries := readGolden(t, "clean", ledger.FormatJSONL)
	for _, format := range []string{ledger.FormatCSV, ledger.FormatJSONL} {
		t.Run(format, func(t *testing.T) {
			f, err := os.Open(filepath.Join(goldenDir, "provider-usage."+format))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rep, err := ledger.MatchProviderUsage(entries, f, format)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Lines != 8 || rep.Matched != 4 {
				t.Errorf("lines %d matched %d, want 8 and 4", rep.Lines, rep.Matched)
			}
			if len(rep.Unexplained) != 1 || rep.Unexplained[0].RequestID != "req_9f8e7d" || rep.UnexplainedCostMicros != 333_000 {
				t.Errorf("unexplained %+v (%d), want the one req_9f8e7d line costing 333000", rep.Unexplained, rep.UnexplainedCostMicros)
			}
			if len(rep.Uncharged) != 1 || rep.Uncharged[0].RequestID != "oncegate-"+k1 || rep.UnchargedCostMicros != 390 {
				t.Errorf("uncharged %+v (%d), want k1's second call costing 390", rep.Uncharged, rep.UnchargedCostMicros)
			}
			if len(rep.Reversed) != 2 || rep.ReversedCostMicros != 375+215 {
				t.Errorf("reversed %+v (%d), want the zombie's charge and continuation, 590", rep.Reversed, rep.ReversedCostMicros)
			}
			for _, r := range rep.Reversed {
				if !strings.HasPrefix(r.Reason, ledger.ReasonDuplicate) {
					t.Errorf("reversed match %+v without the reversal's reason", r)
				}
			}
			if rep.LedgerReversedMicros != 375+215 {
				t.Errorf("ledger reversed %d, want 590", rep.LedgerReversedMicros)
			}
		})
	}
}

func TestMatchProviderUsageRejects(t *testing.T) {
	tests := []struct{ name, format, data string }{
		{"bad number", ledger.FormatCSV, "oncegate-x,m,1,two,3\n"},
		{"short row", ledger.FormatCSV, "oncegate-x,m,1\n"},
		{"bad json", ledger.FormatJSONL, `{"request_id":`},
		{"unknown field", ledger.FormatJSONL, `{"request_id":"a","surprise":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ledger.MatchProviderUsage(nil, strings.NewReader(tt.data), tt.format); !errors.Is(err, ledger.ErrCorrupt) {
				t.Fatalf("err %v, want ErrCorrupt", err)
			}
		})
	}
}
