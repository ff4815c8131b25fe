package effects

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// State is where an effect stands.
type State string

// States.
const (
	// Claimed: a caller holds the effect (Fence) until LeaseUntil and runs it.
	Claimed State = "claimed"
	// Completed: the effect ran; Result is what it returned, replayed to every later claim.
	Completed State = "completed"
	// NeedsReconcile: whether the effect ran is unknown (the caller said so, or a claim's
	// lease ran out before it completed). A claim is refused until a caller has looked
	// downstream (with the effect key) and either completes it with the current fence or
	// claims it again with Reconciled set.
	NeedsReconcile State = "needs_reconcile"
	// Released: the holder said the effect surely did not run; the next claim runs it.
	Released State = "released"
)

// Sentinel errors.
var (
	// ErrFingerprint is returned by Claim when the effect was claimed before with other
	// arguments (another fingerprint): the same name for a different effect.
	ErrFingerprint = errors.New("effects: the effect was claimed with other arguments")
	// ErrInProgress is returned by Claim while another caller holds a live claim; the
	// entry returned with it says until when (LeaseUntil).
	ErrInProgress = errors.New("effects: the effect is in progress")
	// ErrNeedsReconcile is returned by Claim when the effect's outcome is unknown and the claim
	// did not say it was reconciled; the entry returned with it has the current fence.
	ErrNeedsReconcile = errors.New("effects: the effect's outcome is unknown; reconcile it")
	// ErrStaleFence is returned by Complete, Renew, Unknown and Release when the fence given is not
	// the entry's: another claim took the effect over since.
	ErrStaleFence = errors.New("effects: stale fence")
	// ErrCompleted is returned by Complete with a result other than the one recorded, and by
	// Renew, Unknown and Release, once the effect is completed.
	ErrCompleted = errors.New("effects: the effect is already completed")
	// ErrNotFound is returned when the effect was never claimed (or its entry expired).
	ErrNotFound = errors.New("effects: no such effect")
	// ErrNotClaimed is returned by Complete on a released entry, by Renew on an entry that is
	// not claimed, and by Unknown and Release on one that is neither claimed nor already in
	// the state they report.
	ErrNotClaimed = errors.New("effects: the effect is not claimed")
)

// Entry is one effect's record. The stored form is its JSON, then, once completed, a newline
// and the result's bytes exactly as the caller gave them (encoding them inside the JSON would
// compact and re-escape them).
type Entry struct {
	// Name is the effect's name as the caller gave it (stored, never a subject).
	Name        string `json:"name"`
	State       State  `json:"state"`
	Fingerprint string `json:"fingerprint"`
	// Attempt counts the claims that ran (or may have run) the effect: 1 for the first.
	Attempt int `json:"attempt"`
	// Fence is raised by every claim and by a lease's lapse; a write by a holder must name
	// the current one.
	Fence uint64 `json:"fence"`
	// LeaseUntil ends a claim; zero in the other states.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Nonce is the last claim's own random id: a claim whose answer was lost and is sent
	// again recognises its own write by it.
	Nonce       string    `json:"nonce,omitempty"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// Result is what the effect returned (Completed only): valid JSON, kept byte for byte.
	Result json.RawMessage `json:"-"`
}

// ClaimRequest is what a claim asks.
type ClaimRequest struct {
	Name        string
	Fingerprint string
	Lease       time.Duration
	// Reconciled: the caller has looked downstream and found the effect did not happen (or the
	// downstream system deduplicates by the effect key): an entry that needs reconciling, or
	// whose claim lapsed, is claimed again and run.
	Reconciled bool
	// Nonce identifies this claim, so the same claim sent again after a lost answer is
	// recognised as its own (empty: Store.Claim draws one).
	Nonce string
}

// claim decides a claim of cur (nil: never claimed) at now. It returns the entry to write
// (nil: nothing to write) and the answer's error: nil for a claim (the written entry) or a
// replay (cur, Completed), else ErrFingerprint, ErrInProgress or ErrNeedsReconcile. With both
// an entry and an error, the entry is written and the error answered.
func claim(cur *Entry, req ClaimRequest, now time.Time) (*Entry, error) {
	if cur == nil {
		return &Entry{Name: req.Name, State: Claimed, Fingerprint: req.Fingerprint, Attempt: 1, Fence: 1,
			LeaseUntil: now.Add(req.Lease), Nonce: req.Nonce, Created: now, Updated: now}, nil
	}
	if cur.Fingerprint != req.Fingerprint {
		return nil, ErrFingerprint
	}
	switch cur.State {
	case Completed:
		return nil, nil // a replay
	case Claimed:
		switch {
		case cur.Nonce == req.Nonce:
			return nil, nil // our own claim, whose answer was lost
		case now.Before(cur.LeaseUntil):
			return nil, ErrInProgress
		case !req.Reconciled:
			// The holder's lease ran out before it completed: it may have run the effect.
			// Fence it out, and let nobody run it until someone has reconciled.
			next := *cur
			next.State, next.Fence, next.LeaseUntil, next.Nonce, next.Updated = NeedsReconcile, cur.Fence+1, time.Time{}, req.Nonce, now
			return &next, ErrNeedsReconcile
		}
	case NeedsReconcile:
		if !req.Reconciled {
			return nil, ErrNeedsReconcile
		}
	case Released:
	default:
		return nil, fmt.Errorf("effects: an entry in unknown state %q", cur.State)
	}
	next := *cur
	next.State, next.Attempt, next.Fence = Claimed, cur.Attempt+1, cur.Fence+1
	next.LeaseUntil, next.Nonce, next.Updated = now.Add(req.Lease), req.Nonce, now
	return &next, nil
}

// complete decides the completion of cur by the holder of fence with result.
func complete(cur *Entry, fence uint64, result []byte, now time.Time) (*Entry, error) {
	if err := holds(cur, fence); err != nil {
		return nil, err
	}
	switch cur.State {
	case Completed:
		if bytes.Equal(cur.Result, result) {
			return nil, nil // the same completion again
		}
		return nil, ErrCompleted
	case Released:
		return nil, ErrNotClaimed
	}
	next := *cur
	next.State, next.LeaseUntil, next.Result, next.Updated, next.CompletedAt = Completed, time.Time{}, result, now, now
	return &next, nil
}

// renew decides the holder of fence's renewal of its claim's lease to now+lease. A lease that
// has run out is renewed too while nobody has claimed since (the fence is still current).
func renew(cur *Entry, fence uint64, lease time.Duration, now time.Time) (*Entry, error) {
	if err := holds(cur, fence); err != nil {
		return nil, err
	}
	switch cur.State {
	case Completed:
		return nil, ErrCompleted
	case Claimed:
		next := *cur
		next.LeaseUntil, next.Updated = now.Add(lease), now
		return &next, nil
	}
	return nil, ErrNotClaimed
}

// unknown decides the holder of fence's report that it cannot tell whether the effect ran.
func unknown(cur *Entry, fence uint64, now time.Time) (*Entry, error) {
	return settle(cur, fence, now, NeedsReconcile)
}

// release decides the holder of fence's report that the effect surely did not run.
func release(cur *Entry, fence uint64, now time.Time) (*Entry, error) {
	return settle(cur, fence, now, Released)
}

// settle moves a claim held by fence to state to (NeedsReconcile or Released), ending its
// lease; an entry already in state to is left as it is (the same report again).
func settle(cur *Entry, fence uint64, now time.Time, to State) (*Entry, error) {
	if err := holds(cur, fence); err != nil {
		return nil, err
	}
	switch cur.State {
	case to:
		return nil, nil
	case Completed:
		return nil, ErrCompleted
	case Claimed:
		next := *cur
		next.State, next.LeaseUntil, next.Updated = to, time.Time{}, now
		return &next, nil
	}
	return nil, ErrNotClaimed
}

// holds checks that cur exists and fence is its current fence.
func holds(cur *Entry, fence uint64) error {
	switch {
	case cur == nil:
		return ErrNotFound
	case cur.Fence != fence:
		return ErrStaleFence
	}
	return nil
}
