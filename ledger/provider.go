package ledger

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ForwardedIDPrefix starts the request id oncegate forwards to a provider (as its
// Idempotency-Key): "oncegate-" + the intent's key hash.
const ForwardedIDPrefix = "oncegate-"

// ProviderLine is one line of a provider's usage export: one backend call the provider billed.
type ProviderLine struct {
	Line         int    `json:"line"`
	RequestID    string `json:"request_id"`
	Model        string `json:"model"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	CostMicros   int64  `json:"cost_micros"`
}

// ProviderMatch is a provider line paired with a ledger entry.
type ProviderMatch struct {
	ProviderLine
	EntryID string `json:"entry_id"`
	Reason  string `json:"reason,omitempty"` // the reversal's reason, for a reversed entry
}

// ProviderReport compares a provider's usage export with the ledger.
type ProviderReport struct {
	Lines              int   `json:"lines"`
	ProviderCostMicros int64 `json:"provider_cost_micros"`
	// Matched lines are paired with a charge or continuation that stands.
	Matched           int   `json:"matched"`
	MatchedCostMicros int64 `json:"matched_cost_micros"`
	// Reversed lines are paired with a charge the ledger reversed (a duplicate execution):
	// the provider billed it, the tenant was not — the platform absorbed the cost.
	Reversed           []ProviderMatch `json:"reversed"`
	ReversedCostMicros int64           `json:"reversed_cost_micros"`
	// Uncharged lines belong to a known intent (their request id) that has no ledger charge left
	// to pair with: an execution the ledger never charged (an ambiguous attempt, a retry the
	// backend ran twice). Absorbed by the platform too.
	Uncharged           []ProviderLine `json:"uncharged"`
	UnchargedCostMicros int64          `json:"uncharged_cost_micros"`
	// Unexplained lines match no intent at all: neither their request id nor a charge with the
	// same model and tokens.
	Unexplained           []ProviderLine `json:"unexplained"`
	UnexplainedCostMicros int64          `json:"unexplained_cost_micros"`
	// LedgerReversedMicros is the cost of every reversal in the entries (what the ledger says
	// was not billed to tenants), whether the provider file shows the call or not.
	LedgerReversedMicros int64 `json:"ledger_reversed_micros"`
}

// MatchProviderUsage pairs each line of a provider usage export (format "csv" or "jsonl";
// fields request_id, model, input_tokens, output_tokens, cost_micros; a CSV header line is
// optional) with the ledger's charges and continuations: by request id (the forwarded
// "oncegate-<key hash>"), preferring the same model and tokens, else by model and tokens alone.
// Each ledger entry explains at most one line.
func MatchProviderUsage(entries []Entry, r io.Reader, format string) (ProviderReport, error) {
	lines, err := readProviderUsage(r, format)
	if err != nil {
		return ProviderReport{}, err
	}
	reversal := map[string]string{} // reversed id -> reason
	for i := range entries {
		if e := &entries[i]; e.Kind == KindReversal {
			reversal[e.Refers] = e.Reason
		}
	}
	var rep ProviderReport
	byKey := map[string][]*Entry{}
	byUsage := map[string][]*Entry{}
	used := map[*Entry]bool{}
	usageKey := func(model string, in, out int) string {
		return model + "\x00" + strconv.Itoa(in) + "\x00" + strconv.Itoa(out)
	}
	for i := range entries {
		e := &entries[i]
		switch e.Kind {
		case KindCharge, KindContinuation:
			byKey[e.KeyHash] = append(byKey[e.KeyHash], e)
			k := usageKey(e.Model, e.InputTokens, e.OutputTokens)
			byUsage[k] = append(byUsage[k], e)
		case KindReversal:
			rep.LedgerReversedMicros += e.CostMicros
		}
	}
	take := func(cands []*Entry, ok func(*Entry) bool) *Entry {
		for _, e := range cands {
			if !used[e] && ok(e) {
				used[e] = true
				return e
			}
		}
		return nil
	}
	for _, pl := range lines {
		rep.Lines++
		rep.ProviderCostMicros += pl.CostMicros
		same := func(e *Entry) bool {
			return e.Model == pl.Model && e.InputTokens == pl.InputTokens && e.OutputTokens == pl.OutputTokens
		}
		var e *Entry
		known := false
		if kh, ok := strings.CutPrefix(pl.RequestID, ForwardedIDPrefix); ok && len(byKey[kh]) > 0 {
			known = true
			cands := byKey[kh]
			if e = take(cands, same); e == nil {
				e = take(cands, func(e *Entry) bool { return e.Model == pl.Model })
			}
		}
		if e == nil && !known {
			e = take(byUsage[usageKey(pl.Model, pl.InputTokens, pl.OutputTokens)], func(*Entry) bool { return true })
		}
		switch {
		case e == nil && known:
			rep.Uncharged = append(rep.Uncharged, pl)
			rep.UnchargedCostMicros += pl.CostMicros
		case e == nil:
			rep.Unexplained = append(rep.Unexplained, pl)
			rep.UnexplainedCostMicros += pl.CostMicros
		default:
			if reason, rev := reversal[e.ID]; rev {
				rep.Reversed = append(rep.Reversed, ProviderMatch{ProviderLine: pl, EntryID: e.ID, Reason: reason})
				rep.ReversedCostMicros += pl.CostMicros
			} else {
				rep.Matched++
				rep.MatchedCostMicros += pl.CostMicros
			}
		}
	}
	return rep, nil
}

var providerHeader = []string{"request_id", "model", "input_tokens", "output_tokens", "cost_micros"}

// readProviderUsage parses a provider usage export.
func readProviderUsage(r io.Reader, format string) ([]ProviderLine, error) {
	switch format {
	case FormatCSV:
		cr := csv.NewReader(r)
		cr.FieldsPerRecord = len(providerHeader)
		cr.TrimLeadingSpace = true
		var out []ProviderLine
		for {
			rec, err := cr.Read()
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			if err != nil { // a *csv.ParseError names its line
				return nil, fmt.Errorf("ledger: provider usage: %w: %v", ErrCorrupt, err)
			}
			line, _ := cr.FieldPos(0)
			if len(out) == 0 && line == 1 && strings.EqualFold(strings.TrimSpace(rec[0]), providerHeader[0]) {
				continue // header
			}
			pl := ProviderLine{Line: line, RequestID: strings.TrimSpace(rec[0]), Model: strings.TrimSpace(rec[1])}
			if pl.InputTokens, err = strconv.Atoi(strings.TrimSpace(rec[2])); err == nil {
				if pl.OutputTokens, err = strconv.Atoi(strings.TrimSpace(rec[3])); err == nil {
					pl.CostMicros, err = strconv.ParseInt(strings.TrimSpace(rec[4]), 10, 64)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("ledger: provider usage line %d: %w: %v", line, ErrCorrupt, err)
			}
			out = append(out, pl)
		}
	case FormatJSONL:
		br := bufio.NewReaderSize(r, 64<<10)
		var out []ProviderLine
		for line := 1; ; line++ {
			b, err := readLine(br)
			if errors.Is(err, io.EOF) && len(b) == 0 {
				return out, nil
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("ledger: provider usage line %d: %w", line, err)
			}
			if b = bytes.TrimSpace(b); len(b) == 0 {
				continue
			}
			var pl ProviderLine
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&pl); err != nil {
				return nil, fmt.Errorf("ledger: provider usage line %d: %w: %v", line, ErrCorrupt, err)
			}
			pl.Line = line
			out = append(out, pl)
		}
	}
	return nil, fmt.Errorf("ledger: provider usage: %w: format %q (csv or jsonl)", ErrInvalid, format)
}
