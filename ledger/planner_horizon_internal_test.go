package ledger

import (
	"testing"
	"time"
)

// TestPlannerForgetsOneHorizon: with a horizon, Reconcile's summary drops the intents charged once
// whose charge is older than the horizon (with their continuations and reversal marks), keeps
// the intents charged more than once, and without a horizon keeps everything.
func TestPlannerForgetsOneHorizon(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	charge := func(job string, attempt int, at time.Time) *Entry {
		e := &Entry{Kind: KindCharge, Tenant: "acme", KeyHash: "0123456789abcdef0123456789abcdef", JobID: job, Epoch: attempt, Attempt: 1, Time: at}
		e.ID = ChargeID(e.KeyHash, e.JobID, e.Epoch, e.Attempt)
		return e
	}
	cont := func(of *Entry) *Entry {
		e := &Entry{Kind: KindContinuation, Tenant: of.Tenant, KeyHash: of.KeyHash, JobID: of.JobID, Epoch: of.Epoch, Attempt: 1, Refers: of.ID, Time: of.Time}
		e.ID = ContinuationID(e.KeyHash, e.JobID, e.Epoch, e.Attempt)
		return e
	}
	reversal := func(of *Entry) *Entry {
		return &Entry{Kind: KindReversal, Tenant: of.Tenant, KeyHash: of.KeyHash, JobID: of.JobID, Refers: of.ID, ID: ReversalID(of.ID), Reason: "test", Time: of.Time}
	}
	for _, tc := range []struct {
		name    string
		horizon time.Duration
		// after an entry two hours later: intents, continuation lists and reversal marks kept
		intents, conts, reversed int
	}{
		{name: "one hour", horizon: time.Hour, intents: 2, conts: 0, reversed: 0},
		{name: "three hours", horizon: 3 * time.Hour, intents: 3, conts: 1, reversed: 1},
		{name: "none", horizon: 0, intents: 3, conts: 1, reversed: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlanner(tc.horizon)
			var seq uint64
			add := func(e *Entry) {
				t.Helper()
				seq++
				e.Seq = seq
				if err := p.add(e); err != nil {
					t.Fatal(err)
				}
			}
			once := charge("J1", 1, t0)
			add(once)
			c := cont(once)
			add(c)
			add(reversal(c))
			add(charge("J2", 1, t0)) // J2 charged twice: a duplicate
			add(charge("J2", 2, t0))
			plan, dups, err := p.plan(func(s uint64) (Entry, error) { return Entry{Seq: s, ID: "x"}, nil })
			if err != nil || len(plan) != 1 || len(dups) != 1 {
				t.Fatalf("first run: %d reversals, %d duplicates, %v; want 1, 1", len(plan), len(dups), err)
			}
			p.clean()
			add(charge("J3", 1, t0.Add(2*time.Hour)))
			p.clean()
			if len(p.intents) != tc.intents || len(p.conts) != tc.conts || len(p.reversed) != tc.reversed {
				t.Fatalf("kept %d intents, %d continuation lists, %d reversal marks; want %d, %d, %d",
					len(p.intents), len(p.conts), len(p.reversed), tc.intents, tc.conts, tc.reversed)
			}
			if _, ok := p.intents[intentOf(charge("J2", 1, t0))]; !ok {
				t.Fatal("the intent charged twice was forgotten")
			}
		})
	}
}
