package effects_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/effects"
	"github.com/oncegate/oncegate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is the rules' clock, moved by the test (leases lapse without waiting).
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func openStore(t *testing.T, ttl time.Duration, c *clock) *effects.Store {
	t.Helper()
	srv := testkit.RunJetStream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := effects.Open(ctx, srv.JS, effects.Config{TTL: ttl, Replicas: 1, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const (
	intentA = "0123456789abcdef0123456789abcdef"
	intentB = "fedcba9876543210fedcba9876543210"
	lease   = 30 * time.Second
)

// step is one call of a rules table: op on the effect named name of intentA (tenant "t1").
type step struct {
	op      string // claim, reclaim (Reconciled), complete, unknown, release, renew, advance
	fp      string
	fence   uint64 // for complete/unknown/release: 0 means "the fence of the last claim"
	result  string
	advance time.Duration
	// want
	state   effects.State
	err     error
	attempt int
	wantFen uint64
	check   func(t *testing.T, e *effects.Entry)
}

// TestRules: the ledger's rules on a real JetStream bucket, one sequence of calls per case.
func TestRules(t *testing.T) {
	const res = `{"id": "msg_1",  "sent":true, "to":"a\u00e9<b>"}` // spacing and escapes kept
	cases := []struct {
		name  string
		steps []step
	}{
		{"claim then complete, a repeat replays byte-identical", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "complete", result: res, state: effects.Completed, wantFen: 1},
			{op: "claim", fp: "f1", state: effects.Completed, attempt: 1, check: func(t *testing.T, e *effects.Entry) {
				if string(e.Result) != res {
					t.Errorf("replayed result %s, want %s byte for byte", e.Result, res)
				}
			}},
		}},
		{"other arguments: fingerprint refused, nothing changes", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "claim", fp: "f2", err: effects.ErrFingerprint},
			{op: "complete", result: `1`, state: effects.Completed, wantFen: 1},
			{op: "claim", fp: "f2", err: effects.ErrFingerprint},
		}},
		{"a live claim: in progress until its lease", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "claim", fp: "f1", err: effects.ErrInProgress, state: effects.Claimed, check: func(t *testing.T, e *effects.Entry) {
				if e.LeaseUntil.IsZero() {
					t.Error("an in-progress answer without its lease's end (Retry-After)")
				}
			}},
			{op: "advance", advance: lease - time.Millisecond},
			{op: "claim", fp: "f1", err: effects.ErrInProgress},
		}},
		{"a lapsed lease: a new fence, needs reconciling, the old holder refused", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "advance", advance: lease},
			{op: "claim", fp: "f1", err: effects.ErrNeedsReconcile, state: effects.NeedsReconcile, attempt: 1, wantFen: 2},
			{op: "complete", fence: 1, result: res, err: effects.ErrStaleFence},
			{op: "unknown", fence: 1, err: effects.ErrStaleFence},
			{op: "claim", fp: "f1", err: effects.ErrNeedsReconcile, wantFen: 2},
			// Reconciled: found downstream (by the effect key) that it ran: completed with the new fence.
			{op: "complete", fence: 2, result: res, state: effects.Completed, wantFen: 2},
			{op: "claim", fp: "f1", state: effects.Completed},
		}},
		{"a lapsed lease claimed as reconciled: a new attempt and fence", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "advance", advance: lease + time.Second},
			{op: "reclaim", fp: "f1", state: effects.Claimed, attempt: 2, wantFen: 2},
			{op: "complete", fence: 1, result: `"old"`, err: effects.ErrStaleFence},
			{op: "complete", fence: 2, result: `"new"`, state: effects.Completed},
		}},
		{"unknown outcome: needs reconciling, never run again silently", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "unknown", fence: 1, state: effects.NeedsReconcile, wantFen: 1},
			{op: "unknown", fence: 1, state: effects.NeedsReconcile}, // the same report again
			{op: "advance", advance: 24 * time.Hour},
			{op: "claim", fp: "f1", err: effects.ErrNeedsReconcile},
			{op: "reclaim", fp: "f1", state: effects.Claimed, attempt: 2, wantFen: 2},
		}},
		{"renewed: the claim holds past its first lease; a lapsed one is renewed while nobody took it", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, wantFen: 1},
			{op: "advance", advance: lease - time.Second},
			{op: "renew", fence: 1, state: effects.Claimed, wantFen: 1},
			{op: "advance", advance: lease - time.Second},
			{op: "claim", fp: "f1", err: effects.ErrInProgress},
			{op: "advance", advance: 2 * time.Second},
			{op: "renew", fence: 1, state: effects.Claimed, wantFen: 1},
			{op: "claim", fp: "f1", err: effects.ErrInProgress},
			{op: "advance", advance: lease},
			{op: "claim", fp: "f1", err: effects.ErrNeedsReconcile, wantFen: 2},
			{op: "renew", fence: 1, err: effects.ErrStaleFence},
			{op: "renew", fence: 2, err: effects.ErrNotClaimed},
		}},
		{"released: surely did not run, the next claim runs it", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 1, wantFen: 1},
			{op: "release", fence: 1, state: effects.Released},
			{op: "complete", fence: 1, result: `1`, err: effects.ErrNotClaimed},
			{op: "claim", fp: "f1", state: effects.Claimed, attempt: 2, wantFen: 2},
		}},
		{"completion: sent again is the same, another result refused", []step{
			{op: "claim", fp: "f1", state: effects.Claimed, wantFen: 1},
			{op: "complete", fence: 1, result: res, state: effects.Completed},
			{op: "complete", fence: 1, result: res, state: effects.Completed},
			{op: "complete", fence: 1, result: `{"other":1}`, err: effects.ErrCompleted},
			{op: "unknown", fence: 1, err: effects.ErrCompleted},
			{op: "release", fence: 1, err: effects.ErrCompleted},
		}},
		{"nothing claimed", []step{
			{op: "complete", fence: 1, result: `1`, err: effects.ErrNotFound},
			{op: "unknown", fence: 1, err: effects.ErrNotFound},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			s := openStore(t, time.Hour, c)
			ctx := context.Background()
			id := effects.ID{Tenant: "t1", Intent: intentA, Name: "call_1"}
			var fence uint64
			for i, st := range tc.steps {
				var e *effects.Entry
				var err error
				f := st.fence
				if f == 0 {
					f = fence
				}
				switch st.op {
				case "advance":
					c.advance(st.advance)
					continue
				case "claim", "reclaim":
					e, err = s.Claim(ctx, id, effects.ClaimRequest{Fingerprint: st.fp, Lease: lease, Reconciled: st.op == "reclaim"})
					if err == nil && e.State == effects.Claimed {
						fence = e.Fence
					}
				case "complete":
					e, err = s.Complete(ctx, id, f, []byte(st.result))
				case "unknown":
					e, err = s.Unknown(ctx, id, f)
				case "release":
					e, err = s.Release(ctx, id, f)
				case "renew":
					e, err = s.Renew(ctx, id, f, lease)
				}
				where := fmt.Sprintf("step %d (%s)", i+1, st.op)
				if !errors.Is(err, st.err) {
					t.Fatalf("%s: error %v, want %v", where, err, st.err)
				}
				if st.state != "" && (e == nil || e.State != st.state) {
					t.Fatalf("%s: entry %+v, want state %s", where, e, st.state)
				}
				if st.attempt != 0 && e.Attempt != st.attempt {
					t.Errorf("%s: attempt %d, want %d", where, e.Attempt, st.attempt)
				}
				if st.wantFen != 0 && e.Fence != st.wantFen {
					t.Errorf("%s: fence %d, want %d", where, e.Fence, st.wantFen)
				}
				if st.check != nil {
					st.check(t, e)
				}
			}
		})
	}
}

// TestClaimRace: many claims of one effect at once: exactly one holds it, the others are
// told it is in progress.
func TestClaimRace(t *testing.T) {
	claimRace(t, []*effects.Store{openStore(t, time.Hour, newClock())})
}

// TestClaimRaceR3: the same on a three-server cluster, the bucket on three replicas, each
// claimant on a server of its own: a lost compare-and-set there is another error code (10164),
// and a direct read may come from a replica behind its leader.
func TestClaimRaceR3(t *testing.T) {
	c := testkit.RunCluster(t, 3)
	var stores []*effects.Store
	for i := range c.Size() {
		_, js := c.ConnectTo(t, i)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := effects.Open(ctx, js, effects.Config{TTL: time.Hour, Replicas: 3})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	claimRace(t, stores)
}

// claimRace claims one effect 16 times at once, through the stores in turn.
func claimRace(t *testing.T, stores []*effects.Store) {
	id := effects.ID{Tenant: "t1", Intent: intentA, Name: "call_race"}
	const n = 16
	var claimed, busy atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := stores[i%len(stores)].Claim(context.Background(), id, effects.ClaimRequest{Fingerprint: "f", Lease: lease})
			switch {
			case err == nil:
				claimed.Add(1)
			case errors.Is(err, effects.ErrInProgress):
				busy.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if claimed.Load() != 1 || busy.Load() != n-1 {
		t.Fatalf("%d claimed, %d in progress; want 1 and %d", claimed.Load(), busy.Load(), n-1)
	}
}

// TestScopeAndList: an effect is its tenant's and its intent's: the same name elsewhere is
// another effect with another effect key; List shows one intent's effects of one tenant.
func TestScopeAndList(t *testing.T) {
	s := openStore(t, time.Hour, newClock())
	ctx := context.Background()
	ids := []effects.ID{
		{Tenant: "t1", Intent: intentA, Name: "call_1"},
		{Tenant: "t1", Intent: intentA, Name: "call_2"},
		{Tenant: "t2", Intent: intentA, Name: "call_1"},
		{Tenant: "t1", Intent: intentB, Name: "call_1"},
	}
	keys := map[string]bool{}
	for _, id := range ids {
		e, err := s.Claim(ctx, id, effects.ClaimRequest{Fingerprint: "f", Lease: lease})
		if err != nil || e.State != effects.Claimed || e.Attempt != 1 {
			t.Fatalf("%+v: %+v %v, want a first claim each", id, e, err)
		}
		keys[id.EffectKey()] = true
	}
	if len(keys) != len(ids) {
		t.Errorf("%d distinct effect keys for %d effects", len(keys), len(ids))
	}
	if k := ids[0].EffectKey(); k != (effects.ID{Tenant: "t1", Intent: intentA, Name: "call_1"}).EffectKey() || len(k) != 32 {
		t.Errorf("effect key %q is not stable, or not 32 hex digits", k)
	}
	got, err := s.List(ctx, "t1", intentA)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range got {
		names[e.Name] = true
	}
	if len(got) != 2 || !names["call_1"] || !names["call_2"] {
		t.Fatalf("List(t1, A) = %d entries %v, want call_1 and call_2", len(got), names)
	}
	if got, err := s.List(ctx, "t3", intentA); err != nil || len(got) != 0 {
		t.Fatalf("List of another tenant: %d entries, %v; want none", len(got), err)
	}
	if _, err := s.Claim(ctx, effects.ID{Tenant: "t1", Intent: "not-a-hash", Name: "x"}, effects.ClaimRequest{Fingerprint: "f", Lease: lease}); err == nil {
		t.Fatal("a claim under an intent that is not a record key was accepted")
	}
}

// TestTTL: an entry is kept for the bucket's TTL after its last write, then it is gone and the
// name is new (as the intent whose answer named it is).
func TestTTL(t *testing.T) {
	s := openStore(t, time.Second, newClock()) // the bucket's TTL on the server's own clock
	ctx := context.Background()
	id := effects.ID{Tenant: "t1", Intent: intentA, Name: "call_ttl"}
	e, err := s.Claim(ctx, id, effects.ClaimRequest{Fingerprint: "f", Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, id, e.Fence, []byte(`true`)); err != nil {
		t.Fatal(err)
	}
	if s.TTL() != time.Second {
		t.Fatalf("TTL %s", s.TTL())
	}
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		e, err := s.Claim(ctx, id, effects.ClaimRequest{Fingerprint: "other", Lease: lease})
		switch {
		case err == nil && e.State == effects.Claimed && e.Attempt == 1:
			return nil
		case err != nil && !errors.Is(err, effects.ErrFingerprint):
			t.Fatal(err)
		}
		return fmt.Errorf("still kept: %v", err)
	})
}
