package ledger_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/ledger"
)

// TestBillCalls: successful calls, cost per call, duplicate ratio and executions avoided,
// from entries and tally reports, with exact numbers.
func TestBillCalls(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	from, to := t0, t0.AddDate(0, 1, 0)
	n := 0
	entry := func(kind, model string, cost int64, completed bool, at time.Time) ledger.Entry {
		n++
		return ledger.Entry{ID: fmt.Sprintf("%s.%d", kind, n), Kind: kind, Tenant: "acme", Model: model, CostMicros: cost,
			Completed: completed, Currency: "USD", Time: at}
	}
	charge := func(model string, cost int64, completed bool) ledger.Entry {
		return entry(ledger.KindCharge, model, cost, completed, t0.Add(time.Hour))
	}
	report := func(id, model string, joined, replayed int, saved int64, end time.Time) ledger.TallyReport {
		return ledger.TallyReport{ID: id, Tenant: "acme", From: end.Add(-10 * time.Second), To: end,
			Models: []ledger.TallyCounts{{Model: model, Joined: joined, Replayed: replayed, SavedMicros: saved}}}
	}
	mid := t0.Add(24 * time.Hour)
	tests := []struct {
		name    string
		entries []ledger.Entry
		tallies []ledger.TallyReport
		want    ledger.Calls
	}{
		{"3 completed charges of 100, 5 joins and 2 replays",
			[]ledger.Entry{charge("m", 100, true), charge("m", 100, true), charge("m", 100, true)},
			[]ledger.TallyReport{report("r1", "m", 5, 2, 700, mid)},
			ledger.Calls{CompletedCharges: 3, Joined: 5, Replayed: 2, ExecutionsAvoided: 7, SavedMicros: 700,
				SuccessfulCalls: 10, CostPerSuccessfulCallMicros: 30, DuplicateRatio: 0.7}},
		{"nothing: zeros, no division",
			nil, nil, ledger.Calls{}},
		{"charges not completed are paid for but are no successful call",
			[]ledger.Entry{charge("m", 100, true), charge("m", 50, false)},
			nil,
			ledger.Calls{CompletedCharges: 1, SuccessfulCalls: 1, CostPerSuccessfulCallMicros: 150}},
		{"no successful call at all: cost per call 0",
			[]ledger.Entry{charge("m", 50, false)},
			nil,
			ledger.Calls{}},
		{"a reversal lowers the net, not the calls; cost per call rounds half up",
			[]ledger.Entry{charge("m", 100, true), charge("m", 100, true), entry(ledger.KindReversal, "m", 99, false, mid)},
			nil,
			ledger.Calls{CompletedCharges: 2, SuccessfulCalls: 2, CostPerSuccessfulCallMicros: 51}},
		{"only executions avoided: ratio 1, cost 0",
			nil,
			[]ledger.TallyReport{report("r1", "m", 1, 1, 20, mid)},
			ledger.Calls{Joined: 1, Replayed: 1, ExecutionsAvoided: 2, SavedMicros: 20, SuccessfulCalls: 2, DuplicateRatio: 1}},
		{"a report counts by its interval's end: at from yes, at to no, a repeated id once",
			[]ledger.Entry{charge("m", 100, true)},
			[]ledger.TallyReport{report("r1", "m", 1, 0, 1, from), report("r2", "m", 0, 1, 1, to),
				report("r3", "m", 0, 1, 1, from.Add(-time.Second)), report("r1", "m", 1, 0, 1, from)},
			ledger.Calls{CompletedCharges: 1, Joined: 1, ExecutionsAvoided: 1, SavedMicros: 1, SuccessfulCalls: 2,
				CostPerSuccessfulCallMicros: 50, DuplicateRatio: 0.5}},
		{"another tenant's report is not counted",
			[]ledger.Entry{charge("m", 100, true)},
			[]ledger.TallyReport{{ID: "g1", Tenant: "globex", To: mid, Models: []ledger.TallyCounts{{Model: "m", Joined: 9}}}},
			ledger.Calls{CompletedCharges: 1, SuccessfulCalls: 1, CostPerSuccessfulCallMicros: 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ledger.ComputeBill(tc.entries, "acme", from, to, tc.tallies...)
			if err != nil {
				t.Fatal(err)
			}
			if b.Calls != tc.want {
				t.Errorf("bill calls %+v\nwant       %+v", b.Calls, tc.want)
			}
			// One model: its line says the same.
			if len(b.ByModel) == 1 && b.ByModel[0].Calls != tc.want {
				t.Errorf("model line %+v\nwant       %+v", b.ByModel[0].Calls, tc.want)
			}
		})
	}
}

// TestBillCallsByModel: each model's line has its own calls; a model only in the tally gets
// a line; the JSON has the fields.
func TestBillCallsByModel(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	entries := []ledger.Entry{
		{ID: "c1", Kind: ledger.KindCharge, Tenant: "acme", Model: "a", CostMicros: 90, Completed: true, Currency: "USD", Time: t0},
		{ID: "c2", Kind: ledger.KindCharge, Tenant: "acme", Model: "a", CostMicros: 90, Completed: true, Currency: "USD", Time: t0},
	}
	tallies := []ledger.TallyReport{{ID: "r1", Tenant: "acme", To: t0, Models: []ledger.TallyCounts{
		{Model: "a", Joined: 1, SavedMicros: 90}, {Model: "b", Replayed: 3, SavedMicros: 30}}}}
	b, err := ledger.ComputeBill(entries, "", time.Time{}, time.Time{}, tallies...)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.ByModel) != 2 {
		t.Fatalf("lines %+v", b.ByModel)
	}
	a, bl := b.ByModel[0].Calls, b.ByModel[1].Calls
	if a.SuccessfulCalls != 3 || a.CostPerSuccessfulCallMicros != 60 || a.DuplicateRatio != 1.0/3 {
		t.Errorf("model a %+v", a)
	}
	if bl.SuccessfulCalls != 3 || bl.ExecutionsAvoided != 3 || bl.CostPerSuccessfulCallMicros != 0 || bl.DuplicateRatio != 1 {
		t.Errorf("model b %+v", bl)
	}
	if b.SuccessfulCalls != 6 || b.ExecutionsAvoided != 4 || b.SavedMicros != 120 || b.CostPerSuccessfulCallMicros != 30 {
		t.Errorf("total %+v", b.Calls)
	}
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"completed_charges", "joined", "replayed", "executions_avoided", "saved_micros", "successful_calls",
		"cost_per_successful_call_micros", "duplicate_ratio"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON has no %s: %s", k, raw)
		}
		if _, ok := m["by_model"].([]any)[0].(map[string]any)[k]; !ok {
			t.Errorf("a model line's JSON has no %s", k)
		}
	}
}
