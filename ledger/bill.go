package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Bill sums a tenant's entries over a period. A reversal counts in the period in which it was
// appended (like a credit note), so the bill of a closed period never changes.
//
// Calls (for the whole bill and per model) adds the executions avoided, from the tally
// reports (see Tally) whose interval ends in the period, to the completed charges of the
// period: see Calls for what each number means.
//
// In JSON, an open bound (the zero From or To) is null, not year 1, and first_entry and
// last_entry give the time range the bill's entries actually cover (null without entries).
type Bill struct {
	Tenant   string    `json:"tenant"` // "" = every tenant
	From     time.Time `json:"from"`   // requested, inclusive; zero = from the beginning
	To       time.Time `json:"to"`     // requested, exclusive; zero = up to now
	Currency string    `json:"currency"`

	// FirstEntry and LastEntry are the times of the earliest and latest entries counted.
	FirstEntry time.Time `json:"first_entry"`
	LastEntry  time.Time `json:"last_entry"`

	GrossMicros    int64 `json:"gross_micros"`    // charges and continuations
	ReversedMicros int64 `json:"reversed_micros"` // reversals
	NetMicros      int64 `json:"net_micros"`      // gross - reversed

	Charges       int `json:"charges"`
	Continuations int `json:"continuations"`
	Reversals     int `json:"reversals"`
	Estimated     int `json:"estimated"` // charges and continuations with estimated tokens

	Calls

	ByModel []ModelBill `json:"by_model"` // sorted by model
}

// Calls are the successful calls of a bill (or of one model's line) and what they cost:
//
//   - completed_charges: charges whose execution reached COMPLETED (Entry.Completed); a
//     reversal does not subtract one (it takes back money, not the answer the client got);
//   - joined, replayed, executions_avoided (their sum) and saved_micros: the copies that
//     reached no backend, counted by the tally reports whose interval ends in the bill's
//     period, and what their executions would have cost;
//   - successful_calls: completed charges plus executions avoided;
//   - cost_per_successful_call_micros: net / successful calls, rounded to the nearest
//     micro-unit (half away from zero); 0 when there is no successful call;
//   - duplicate_ratio: executions avoided / successful calls, in [0, 1]; 0 when there is no
//     successful call.
//
// The tally is flushed by each process every few seconds: a crash loses at most the counts
// of its last interval, so executions avoided can be slightly under, never over.
type Calls struct {
	CompletedCharges            int     `json:"completed_charges"`
	Joined                      int     `json:"joined"`
	Replayed                    int     `json:"replayed"`
	ExecutionsAvoided           int     `json:"executions_avoided"`
	SavedMicros                 int64   `json:"saved_micros"`
	SuccessfulCalls             int     `json:"successful_calls"`
	CostPerSuccessfulCallMicros int64   `json:"cost_per_successful_call_micros"`
	DuplicateRatio              float64 `json:"duplicate_ratio"`
}

func (c *Calls) addAvoided(tc *TallyCounts) {
	c.Joined += tc.Joined
	c.Replayed += tc.Replayed
	c.SavedMicros += tc.SavedMicros
}

// finish derives the sums and ratios from the counts and the net.
func (c *Calls) finish(net int64) {
	c.ExecutionsAvoided = c.Joined + c.Replayed
	c.SuccessfulCalls = c.CompletedCharges + c.ExecutionsAvoided
	c.CostPerSuccessfulCallMicros, c.DuplicateRatio = 0, 0
	if n := int64(c.SuccessfulCalls); n > 0 {
		q, r := net/n, net%n
		if 2*r >= n {
			q++
		} else if -2*r >= n {
			q--
		}
		c.CostPerSuccessfulCallMicros = q
		c.DuplicateRatio = float64(c.ExecutionsAvoided) / float64(n)
	}
}

// MarshalJSON writes the zero times (an open bound, no entries) as null.
func (b Bill) MarshalJSON() ([]byte, error) {
	type plain Bill // no methods: no recursion
	orNull := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	// The outer fields shadow the embedded ones of the same JSON name.
	return json.Marshal(struct {
		plain
		From       *time.Time `json:"from"`
		To         *time.Time `json:"to"`
		FirstEntry *time.Time `json:"first_entry"`
		LastEntry  *time.Time `json:"last_entry"`
	}{plain(b), orNull(b.From), orNull(b.To), orNull(b.FirstEntry), orNull(b.LastEntry)})
}

// ModelBill is one model's line of a bill.
type ModelBill struct {
	Model          string `json:"model"`
	Charges        int    `json:"charges"`
	Continuations  int    `json:"continuations"`
	Reversals      int    `json:"reversals"`
	InputTokens    int64  `json:"input_tokens"`  // billed (net of reversals)
	OutputTokens   int64  `json:"output_tokens"` // billed (net of reversals)
	GrossMicros    int64  `json:"gross_micros"`
	ReversedMicros int64  `json:"reversed_micros"`
	NetMicros      int64  `json:"net_micros"`
	Calls
}

// Bill computes the bill of tenant ("" = every tenant together) for entries with Time in
// [from, to) (zero: open), and the tally reports (Tallies) whose interval ends in [from, to).
func (l *Ledger) Bill(ctx context.Context, tenant string, from, to time.Time) (*Bill, error) {
	return billOf(ctx, []*Ledger{l}, tenant, from, to)
}

// billOf is the bill of the entries of every ledger of ls (Bill, Set.Bill), with the tally
// reports read once (OG_TALLY is one stream for every partition).
func billOf(ctx context.Context, ls []*Ledger, tenant string, from, to time.Time) (*Bill, error) {
	b := newBillBuilder(tenant, from, to)
	for _, l := range ls {
		if err := l.Scan(ctx, tenant, from, to, func(e Entry) error { return b.add(&e) }); err != nil {
			return nil, err
		}
	}
	reports, err := ls[0].Tallies(ctx, tenant, from, to)
	if err != nil {
		return nil, err
	}
	b.addTallies(reports)
	out := b.finish()
	if out.Currency == "" {
		out.Currency = ls[0].currency
	}
	return out, nil
}

// ComputeBill is Bill over entries already read (an export): those of tenant ("" = all) with
// Time in [from, to), and the tally reports given (none: no executions avoided) of tenant
// whose interval ends in [from, to), each report id once.
func ComputeBill(entries []Entry, tenant string, from, to time.Time, tallies ...TallyReport) (*Bill, error) {
	b := newBillBuilder(tenant, from, to)
	for i := range entries {
		e := &entries[i]
		if (tenant != "" && e.Tenant != tenant) || !inPeriod(e.Time, from, to) {
			continue
		}
		if err := b.add(e); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	var reports []TallyReport
	for _, r := range tallies {
		if (tenant != "" && r.Tenant != tenant) || !inPeriod(r.To, from, to) || seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		reports = append(reports, r)
	}
	b.addTallies(reports)
	return b.finish(), nil
}

type billBuilder struct {
	bill   Bill
	models map[string]*ModelBill
}

func newBillBuilder(tenant string, from, to time.Time) *billBuilder {
	return &billBuilder{bill: Bill{Tenant: tenant, From: from, To: to}, models: map[string]*ModelBill{}}
}

func (b *billBuilder) add(e *Entry) error {
	if b.bill.Currency == "" {
		b.bill.Currency = e.Currency
	} else if e.Currency != b.bill.Currency {
		return fmt.Errorf("ledger: bill: %w: %s and %s (entry %s)", ErrCurrencyMismatch, b.bill.Currency, e.Currency, e.ID)
	}
	if b.bill.FirstEntry.IsZero() || e.Time.Before(b.bill.FirstEntry) {
		b.bill.FirstEntry = e.Time
	}
	if e.Time.After(b.bill.LastEntry) {
		b.bill.LastEntry = e.Time
	}
	m := b.model(e.Model)
	in, out := int64(e.InputTokens), int64(e.OutputTokens)
	switch e.Kind {
	case KindCharge, KindContinuation:
		if e.Kind == KindCharge {
			b.bill.Charges++
			m.Charges++
			if e.Completed {
				b.bill.CompletedCharges++
				m.CompletedCharges++
			}
		} else {
			b.bill.Continuations++
			m.Continuations++
		}
		if e.Estimated {
			b.bill.Estimated++
		}
		b.bill.GrossMicros += e.CostMicros
		m.GrossMicros += e.CostMicros
		m.InputTokens += in
		m.OutputTokens += out
	case KindReversal:
		b.bill.Reversals++
		m.Reversals++
		b.bill.ReversedMicros += e.CostMicros
		m.ReversedMicros += e.CostMicros
		m.InputTokens -= in
		m.OutputTokens -= out
	default:
		return fmt.Errorf("ledger: bill: %w: entry %s has kind %q", ErrCorrupt, e.ID, e.Kind)
	}
	return nil
}

func (b *billBuilder) model(name string) *ModelBill {
	m := b.models[name]
	if m == nil {
		m = &ModelBill{Model: name}
		b.models[name] = m
	}
	return m
}

// addTallies adds the executions avoided of reports (already filtered to the bill).
func (b *billBuilder) addTallies(reports []TallyReport) {
	for i := range reports {
		for j := range reports[i].Models {
			tc := &reports[i].Models[j]
			b.bill.addAvoided(tc)
			b.model(tc.Model).addAvoided(tc)
		}
	}
}

func (b *billBuilder) finish() *Bill {
	out := b.bill
	out.NetMicros = out.GrossMicros - out.ReversedMicros
	out.Calls.finish(out.NetMicros)
	out.ByModel = make([]ModelBill, 0, len(b.models))
	for _, m := range b.models {
		m.NetMicros = m.GrossMicros - m.ReversedMicros
		m.Calls.finish(m.NetMicros)
		out.ByModel = append(out.ByModel, *m)
	}
	slices.SortFunc(out.ByModel, func(a, c ModelBill) int { return strings.Compare(a.Model, c.Model) })
	return &out
}

// FormatMicros renders micro-units as a decimal amount with six decimals ("-1.250000").
func FormatMicros(m int64) string {
	sign := ""
	u := uint64(m)
	if m < 0 {
		sign, u = "-", uint64(-m) // -MinInt64 wraps to itself, which as uint64 is right
	}
	return fmt.Sprintf("%s%d.%06d", sign, u/1_000_000, u%1_000_000)
}
