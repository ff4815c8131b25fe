package ledger

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/partition"
)

// ReconcileReport is what one Reconcile found and did.
type ReconcileReport struct {
	Entries int `json:"entries"` // entries read by this run
	Intents int `json:"intents"` // intents with at least one charge in the summary (the whole ledger, or one reconcile horizon)
	// Duplicates are the intents found charged more than once (not yet reversed).
	Duplicates []Duplicate `json:"duplicates"`
	// Appended are the reversals this run wrote; AlreadyThere counts planned reversals another
	// reconciler wrote first.
	Appended       []Entry `json:"appended"`
	AlreadyThere   int     `json:"already_there"`
	ReversedMicros int64   `json:"reversed_micros"` // cost of the reversals appended
	// RepeatedIDs are entry ids found more than once (only possible when a charge was published
	// again past the dedup horizon without ChargeInput.After): Reconcile counts the first and
	// leaves the others for an operator; Verify reports them.
	RepeatedIDs []string `json:"repeated_ids,omitempty"`
	// ForgottenEarly counts the intents charged once that the summary, at its size bound
	// (WithReconcileLimit), forgot before the horizon.
	ForgottenEarly int `json:"forgotten_early,omitempty"`
	// Partition is the partition a Ledger's report is of; Partitions, of a Set's report (the
	// sum of them), the report of each of its partitions.
	Partition  int               `json:"partition,omitempty"`
	Partitions []ReconcileReport `json:"partitions,omitempty"`
}

// Duplicate is an intent (tenant, job id) with more than one charge standing; KeyHash is the
// kept charge's.
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

// reconState is what Reconcile keeps between runs: a compact summary of the entries read so far
// (about 100 bytes per intent; with a reconcile horizon, only of the intents that can still
// be charged again) and the sequence it reached.
type reconState struct {
	mu      chanMutex
	p       *planner
	lastSeq uint64
}

// Reconcile finds intents (tenant + job id, whatever key hash they were charged under) with more than one charge standing —
// say a worker vanished mid-call, its lease was taken over and both epochs charged — and
// reverses all but one: the first charge whose execution completed if there is one, else the
// first. The continuations of a reversed duplicate are reversed too, so an intent's net is at
// most one execution's cost. Reversal ids are deterministic: running Reconcile again, or in
// two processes at once, appends nothing more.
//
// The first run in a process reads the whole ledger; later runs of the same Ledger read only
// the entries appended since (the summary of the older ones is kept in memory), so a periodic
// Reconcile costs what was appended, not the ledger's size. With WithReconcileHorizon the summary
// forgets intents charged once whose charge is older than the horizon: the charges of one
// intent all come from the epochs of one job, while its idempotency record exists, so a
// second charge cannot come that late, and the summary stays the size of one horizon instead
// of growing for the life of the process. A Ledger without a horizon (the `oncegate ledger
// reconcile` command) keeps every intent. Runs of one Ledger are serialized.
func (l *Ledger) Reconcile(ctx context.Context) (ReconcileReport, error) {
	rs := l.reconState()
	if err := rs.mu.LockCtx(ctx); err != nil {
		return ReconcileReport{}, fmt.Errorf("ledger: reconcile: %w", err)
	}
	defer rs.mu.Unlock()
	if rs.p == nil {
		rs.p, rs.lastSeq = newPlanner(l.reconcileHorizon), 0
		if l.reconcileHorizon > 0 {
			rs.p.limit = l.reconcileLimit
		}
	}
	rep := ReconcileReport{Partition: int(l.part)}
	// Entries read are kept even if the scan fails half way: the summary stays exact up to lastSeq.
	err := l.scan(ctx, l.all, span{start: rs.lastSeq + 1}, func(e *Entry) error {
		if err := rs.p.add(e); err != nil {
			return err
		}
		rs.lastSeq = e.Seq
		rep.Entries++
		if cutoff, n := rs.p.trim(); n > 0 {
			rep.ForgottenEarly += n
			l.log.Warn().Int("limit", rs.p.limit).Int("forgotten", n).Time("charged_before", cutoff).
				Msg("reconcile summary at its size bound: intents charged once forgotten before the horizon")
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("ledger: reconcile: %w", err)
	}
	rep.Intents = len(rs.p.intents)
	rep.RepeatedIDs, rs.p.repeated = rs.p.repeated, nil
	plan, dups, err := rs.p.plan(func(seq uint64) (Entry, error) { return l.entryAt(ctx, seq) })
	if err != nil {
		return rep, fmt.Errorf("ledger: reconcile: %w", err)
	}
	rep.Duplicates = dups
	for _, pr := range plan {
		r, created, err := l.reverse(ctx, &pr.Of, pr.Reason, true)
		if err != nil {
			return rep, fmt.Errorf("ledger: reconcile: %w", err)
		}
		rs.p.reversed[digest(r.Refers)] = strings.HasPrefix(r.Reason, ReasonDuplicate)
		if !created {
			rep.AlreadyThere++
			continue
		}
		rep.Appended = append(rep.Appended, r)
		rep.ReversedMicros += r.CostMicros
		l.log.Warn().Str(fieldTenant, r.Tenant).Str(fieldKeyHash, r.KeyHash).Str(fieldJobID, r.JobID).
			Str(fieldEntryID, r.Refers).Int64(fieldCost, r.CostMicros).Msg("duplicate charge reversed")
	}
	rs.p.clean()
	l.metrics.DuplicateExecutions(duplicatesReversed(rep.Appended))
	return rep, nil
}

// duplicatesReversed counts the intents whose duplicate charges these reversals reverse. Each
// reversal is appended once, by one reconciler, so each duplicate execution is counted once
// across nodes and runs.
func duplicatesReversed(appended []Entry) int {
	seen := map[[2]string]bool{}
	for _, r := range appended {
		if strings.HasPrefix(r.Reason, ReasonDuplicate) {
			seen[[2]string{r.Tenant, r.JobID}] = true
		}
	}
	return len(seen)
}

func (l *Ledger) reconState() *reconState {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recon == nil {
		l.recon = &reconState{mu: make(chanMutex, 1)}
	}
	return l.recon
}

// PlanReconcile is what Reconcile would append given these entries (a complete export in
// stream order; of several partitions, each partition's entries in its stream's order, as
// Set.Scan reads them), and the duplicates it found, partition by partition.
func PlanReconcile(entries []Entry) ([]PlannedReversal, []Duplicate, error) {
	byPart := map[partition.P][]Entry{}
	for _, e := range entries {
		p := partition.OfKey(e.KeyHash)
		byPart[p] = append(byPart[p], e)
	}
	var plan []PlannedReversal
	var dups []Duplicate
	for _, p := range slices.Sorted(maps.Keys(byPart)) {
		pl, ds, err := planPartition(byPart[p])
		if err != nil {
			return nil, nil, err
		}
		plan, dups = append(plan, pl...), append(dups, ds...)
	}
	return plan, dups, nil
}

// planPartition is PlanReconcile of one partition's entries (their sequences are its
// stream's).
func planPartition(entries []Entry) ([]PlannedReversal, []Duplicate, error) {
	p := newPlanner(0)
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
	intents  map[idDigest]chargeRef   // the first charge of each intent (most have one)
	more     map[idDigest][]chargeRef // the intent's later charges, in stream order
	conts    map[idDigest][]contRef
	reversed map[idDigest]bool     // reversed id -> reversed as a duplicate
	dirty    map[idDigest]struct{} // intents with entries added since the last plan
	repeated []string              // ids seen again since the last report
	// horizon > 0: intents charged once are forgotten once their charge is older than it
	// (forgetOld, run every horizon/8 of entry time).
	horizon time.Duration
	// limit > 0: past limit intents, trim forgets the oldest charged once (WithReconcileLimit).
	limit  int
	newest time.Time // the latest entry time added
	swept  time.Time // newest at the last forgetOld
}

type chargeRef struct {
	seq       uint64
	id        idDigest
	at        int64 // the entry's time, unix seconds
	completed bool
}

type contRef struct {
	seq uint64
	id  idDigest
}

func newPlanner(horizon time.Duration) *planner {
	return &planner{intents: map[idDigest]chargeRef{}, more: map[idDigest][]chargeRef{}, conts: map[idDigest][]contRef{}, reversed: map[idDigest]bool{},
		dirty: map[idDigest]struct{}{}, horizon: horizon}
}

// intentOf is the execution an entry bills: its tenant and job id. Not its key hash: one job
// can be charged under two (an auto key's archived copy, charged under its own key before
// kv.Record.ChargeKey), and job ids are unique ULIDs, so the key adds nothing but the miss.
func intentOf(e *Entry) idDigest { return digest(e.Tenant + "\x00" + e.JobID) }

func (p *planner) add(e *Entry) error {
	switch e.Kind {
	case KindCharge:
		k, d := intentOf(e), digest(e.ID)
		ref := chargeRef{seq: e.Seq, id: d, at: e.Time.Unix(), completed: e.Completed}
		first, seen := p.intents[k]
		switch {
		case !seen:
			p.intents[k] = ref
		case first.id == d || slices.ContainsFunc(p.more[k], func(c chargeRef) bool { return c.id == d }):
			p.repeated = append(p.repeated, e.ID)
			return nil
		default:
			p.more[k] = append(p.more[k], ref)
		}
	case KindContinuation:
		c, d := digest(e.Refers), digest(e.ID)
		if slices.ContainsFunc(p.conts[c], func(r contRef) bool { return r.id == d }) {
			p.repeated = append(p.repeated, e.ID)
			return nil
		}
		p.conts[c] = append(p.conts[c], contRef{seq: e.Seq, id: d})
	case KindReversal:
		p.reversed[digest(e.Refers)] = strings.HasPrefix(e.Reason, ReasonDuplicate)
	default:
		return fmt.Errorf("%w: seq %d: kind %q", ErrCorrupt, e.Seq, e.Kind)
	}
	p.dirty[intentOf(e)] = struct{}{}
	if e.Time.After(p.newest) {
		p.newest = e.Time
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

// plan lists the reversals to append for the intents added to since the last plan (call
// clean once they are appended), in the stream order of what they reverse, and the duplicates
// found, in the order of their first charge; get reads an entry by sequence.
func (p *planner) plan(get func(uint64) (Entry, error)) ([]PlannedReversal, []Duplicate, error) {
	var order []idDigest
	for k := range p.dirty {
		first, ok := p.intents[k]
		if ok && (len(p.more[k]) > 0 || (p.reversed[first.id] && p.standingConts(first.id))) {
			order = append(order, k) // only intents that can need a reversal
		}
	}
	slices.SortFunc(order, func(a, b idDigest) int { return cmp.Compare(p.intents[a].seq, p.intents[b].seq) })
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
	for _, k := range order {
		charges := append([]chargeRef{p.intents[k]}, p.more[k]...)
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
	slices.SortStableFunc(out, func(a, b PlannedReversal) int { return cmp.Compare(a.Of.Seq, b.Of.Seq) })
	return out, dups, nil
}

// clean forgets which intents were added to (their reversals are appended) and, with a
// horizon, the intents that can no longer be charged again.
func (p *planner) clean() {
	p.dirty = map[idDigest]struct{}{} // a new map: clear keeps the capacity
	if p.horizon > 0 && p.newest.Sub(p.swept) >= p.horizon/8 {
		p.forgetOld(p.newest.Add(-p.horizon))
		p.swept = p.newest
	}
}

// trim forgets, when the summary holds more than limit intents, the intents charged once
// whose charges are the oldest, down to 7/8 of limit (fewer if the rest were charged more
// than once; more if several share the last forgotten second). It returns the cutoff (charges
// before it forgotten) and how many intents it forgot. Sorting the charge times costs
// O(n log n) once per limit/8 intents added.
func (p *planner) trim() (cutoff time.Time, forgot int) {
	if p.limit <= 0 || len(p.intents) <= p.limit {
		return time.Time{}, 0
	}
	ats := make([]int64, 0, len(p.intents))
	for k, first := range p.intents {
		if len(p.more[k]) == 0 {
			ats = append(ats, first.at)
		}
	}
	excess := min(len(p.intents)-p.limit*7/8, len(ats))
	if excess <= 0 {
		return time.Time{}, 0
	}
	slices.Sort(ats)
	cutoff = time.Unix(ats[excess-1]+1, 0)
	before := len(p.intents)
	p.forgetOld(cutoff)
	return cutoff, before - len(p.intents)
}

// forgetOld drops the intents charged once whose charge is older than cutoff, with their
// continuations and reversal marks. Intents charged more than once are kept: they are rare,
// and what they hold decides later reversals.
func (p *planner) forgetOld(cutoff time.Time) {
	before := cutoff.Unix()
	for k, first := range p.intents {
		if first.at >= before || len(p.more[k]) > 0 {
			continue
		}
		for _, c := range p.conts[first.id] {
			delete(p.reversed, c.id)
		}
		delete(p.conts, first.id)
		delete(p.reversed, first.id)
		delete(p.intents, k)
	}
}
