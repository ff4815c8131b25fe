package ledger

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// settableClock is a clock the test moves.
type settableClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *settableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *settableClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestIDIndexKeepsOneHorizon: with a dedup horizon, a process forgets the ids of entries older
// than it as newer ones are appended (its index stays the size of one horizon, as a fresh
// process loads it), and a forgotten id is still found, in the stream, when asked for.
func TestIDIndexKeepsOneHorizon(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStream(ctx, srv.JS); err != nil {
		t.Fatal(err)
	}
	clock := &settableClock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
	l := New(srv.JS, Prices{"m": {InputPerMillion: 1_000_000}}, "USD", WithDedupHorizon(time.Hour), WithClock(clock.Now))
	charge := func(job string) Entry {
		t.Helper()
		e, err := l.Charge(ctx, ChargeInput{Tenant: "acme", KeyHash: "0123456789abcdef0123456789abcdef", JobID: job, Epoch: 1, Attempt: 1, Model: "m", InputTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	indexed := func() int {
		c := l.chain("acme")
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.ids)
	}
	first := charge("01J00000000000000000000001")
	clock.Add(30 * time.Minute)
	charge("01J00000000000000000000002")
	if n := indexed(); n != 2 {
		t.Fatalf("%d ids indexed within the horizon, want 2", n)
	}
	clock.Add(2 * time.Hour)
	charge("01J00000000000000000000003")
	if n := indexed(); n != 1 {
		t.Fatalf("%d ids indexed after two hours, want 1 (the older ones are past the horizon)", n)
	}
	// A forgotten id is still found: charging it again stores nothing new, and it can be reversed.
	before := msgs(ctx, t, l)
	again := charge("01J00000000000000000000001")
	if again.Seq != first.Seq || msgs(ctx, t, l) != before {
		t.Fatalf("charging a forgotten id again: seq %d (first %d), %d entries (before %d)", again.Seq, first.Seq, msgs(ctx, t, l), before)
	}
	if _, err := l.Reverse(ctx, first.ID, "test"); err != nil {
		t.Fatalf("reversing a charge whose id was forgotten: %v", err)
	}
}

func msgs(ctx context.Context, t *testing.T, l *Ledger) uint64 {
	t.Helper()
	st, err := l.js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
