package ledger

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// ReconcileReport is what one Reconcile found and did.
type ReconcileReport struct {
	Entries int `json:"entries"` // entries read
	Intents int `json:"intents"` // intents with at least one charge
	// Duplicates are the intents found charged more than once (not yet reversed).
	Duplicates []Duplicate `json:"duplicates"`
	// Appended are the reversals this run wrote; AlreadyThere counts planned reversals another
	// reconciler wrote first.
	Appended       []Entry `json:"appended"`
	AlreadyThere   int     `json:"already_there"`
	ReversedMicros int64   `json:"reversed_micros"` // cost of the reversals appended
}

// Duplicate is an intent (tenant, key hash, job id) with more than one charge standing.
type Duplicate struct {
	Tenant   string   `json:"tenant"`
	KeyHash  string   `json:"key_hash"`
	JobID    string   `json:"job_id"`
	Kept     string   `json:"kept"`     // the charge that stands
	Reversed []string `json:"reversed"` // the charges (and their continuations) reversed
}

// PlannedReversal is a reversal Reconcile would append.
type PlannedReversal struct {
	Of     Entry  `json:"of"` // the charge or continuation to reverse
	Reason string `json:"reason"`
}

// Reconcile finds intents (tenant + key hash + job id) with more than one charge standing —
// say a worker vanished mid-call, its lease was taken over and both epochs charged — and
// reverses all but one: the first charge whose execution completed if there is one, else the
// first. The continuations of a reversed duplicate are reversed too, so an intent's net is at
// most one execution's cost. Reversal ids are deterministic: running Reconcile again, or in
// two processes at once, appends nothing more.
func (l *Ledger) Reconcile(ctx context.Context) (ReconcileReport, error) {
	p := newPlanner()
	if err := l.scan(ctx, allSubjects, 1, 0, p.add); err != nil {
		return ReconcileReport{}, fmt.Errorf("ledger: reconcile: %w", err)
	}
	rep := ReconcileReport{Entries: p.entries, Intents: len(p.intents)}
	plan, dups, err := p.plan(func(seq uint64) (Entry, error) { return l.entryAt(ctx, seq) })
	if err != nil {
		return rep, fmt.Errorf("ledger: reconcile: %w", err)
	}
	rep.Duplicates = dups
	for _, pr := range plan {
		r, created, err := l.reverse(ctx, &pr.Of, pr.Reason)
		if err != nil {
			return rep, fmt.Errorf("ledger: reconcile: %w", err)
		}
		if !created {
			rep.AlreadyThere++
			continue
		}
		rep.Appended = append(rep.Appended, r)
		rep.ReversedMicros += r.CostMicros
		l.log.Warn().Str(fieldTenant, r.Tenant).Str(fieldKeyHash, r.KeyHash).Str(fieldJobID, r.JobID).
			Str(fieldEntryID, r.Refers).Int64(fieldCost, r.CostMicros).Msg("duplicate charge reversed")
	}
	return rep, nil
}

// PlanReconcile is what Reconcile would append given these entries (a complete export in
// stream order), and the duplicates it found.
func PlanReconcile(entries []Entry) ([]PlannedReversal, []Duplicate, error) {
	p := newPlanner()
	bySeq := make(map[uint64]int, len(entries))
	for i := range entries {
		e := entries[i]
		if e.Seq == 0 {
			e.Seq = uint64(i + 1)
		}
		bySeq[e.Seq] = i
		if err := p.add(&e); err != nil {
			return nil, nil, err
		}
	}
	return p.plan(func(seq uint64) (Entry, error) {
		i, ok := bySeq[seq]
		if !ok {
			return Entry{}, fmt.Errorf("ledger: seq %d: %w", seq, ErrNotFound)
		}
		e := entries[i]
		if e.Seq == 0 {
			e.Seq = seq
		}
		return e, nil
	})
}

// planner keeps what reconciliation needs of each entry, compactly: per intent its charges,
// per charge its continuations, and the set of reversed ids.
type planner struct {
	entries  int
	intents  map[idDigest][]chargeRef
	order    []idDigest // intents in order of their first charge
	conts    map[idDigest][]contRef
	reversed map[idDigest]bool // reversed id -> reversed as a duplicate
}

type chargeRef struct {
	seq       uint64
	id        idDigest
	completed bool
}

type contRef struct {
	seq uint64
	id  idDigest
}

func newPlanner() *planner {
	return &planner{intents: map[idDigest][]chargeRef{}, conts: map[idDigest][]contRef{}, reversed: map[idDigest]bool{}}
}

func intentOf(e *Entry) idDigest { return digest(e.Tenant + "\x00" + e.KeyHash + "\x00" + e.JobID) }

func (p *planner) add(e *Entry) error {
	p.entries++
	switch e.Kind {
	case KindCharge:
		k := intentOf(e)
		cs, seen := p.intents[k]
		if !seen {
			p.order = append(p.order, k)
		}
		p.intents[k] = append(cs, chargeRef{seq: e.Seq, id: digest(e.ID), completed: e.Completed})
	case KindContinuation:
		c := digest(e.Refers)
		p.conts[c] = append(p.conts[c], contRef{seq: e.Seq, id: digest(e.ID)})
	case KindReversal:
		p.reversed[digest(e.Refers)] = strings.HasPrefix(e.Reason, ReasonDuplicate)
	default:
		return fmt.Errorf("%w: seq %d: kind %q", ErrCorrupt, e.Seq, e.Kind)
	}
	return nil
}

// standingConts reports whether charge has a continuation not reversed.
func (p *planner) standingConts(charge idDigest) bool {
	for _, c := range p.conts[charge] {
		if _, done := p.reversed[c.id]; !done {
			return true
		}
	}
	return false
}

// plan lists the reversals to append, in the stream order of what they reverse; get reads an
// entry by sequence.
func (p *planner) plan(get func(uint64) (Entry, error)) ([]PlannedReversal, []Duplicate, error) {
	var out []PlannedReversal
	var dups []Duplicate
	reverseConts := func(charge idDigest, chargeID string) error {
		for _, c := range p.conts[charge] {
			if _, done := p.reversed[c.id]; done {
				continue
			}
			e, err := get(c.seq)
			if err != nil {
				return err
			}
			out = append(out, PlannedReversal{Of: e, Reason: ReasonDuplicate + ": its charge " + chargeID + " was reversed as a duplicate"})
		}
		return nil
	}
	for _, k := range p.order {
		charges := p.intents[k]
		var active []chargeRef
		for _, c := range charges {
			if dup, done := p.reversed[c.id]; done {
				if dup && p.standingConts(c.id) { // continuations appended after their charge's reversal
					e, err := get(c.seq)
					if err != nil {
						return nil, nil, err
					}
					if err := reverseConts(c.id, e.ID); err != nil {
						return nil, nil, err
					}
				}
				continue
			}
			active = append(active, c)
		}
		if len(active) < 2 {
			continue
		}
		keep := 0
		if i := slices.IndexFunc(active, func(c chargeRef) bool { return c.completed }); i >= 0 {
			keep = i
		}
		kept, err := get(active[keep].seq)
		if err != nil {
			return nil, nil, err
		}
		d := Duplicate{Tenant: kept.Tenant, KeyHash: kept.KeyHash, JobID: kept.JobID, Kept: kept.ID}
		for i, c := range active {
			if i == keep {
				continue
			}
			e, err := get(c.seq)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, PlannedReversal{Of: e, Reason: ReasonDuplicate + ": intent charged more than once; kept " + kept.ID})
			d.Reversed = append(d.Reversed, e.ID)
			n := len(out)
			if err := reverseConts(c.id, e.ID); err != nil {
				return nil, nil, err
			}
			for _, r := range out[n:] {
				d.Reversed = append(d.Reversed, r.Of.ID)
			}
		}
		dups = append(dups, d)
	}
	slices.SortStableFunc(out, func(a, b PlannedReversal) int {
		switch {
		case a.Of.Seq < b.Of.Seq:
			return -1
		case a.Of.Seq > b.Of.Seq:
			return 1
		}
		return 0
	})
	return out, dups, nil
}
