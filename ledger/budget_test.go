package ledger_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/ledger"
)

// manualClock is a clock a test moves by hand.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *manualClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *manualClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestBudgets(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	clock := &manualClock{t: time.Date(2026, 4, 30, 12, 0, 0, 0, time.UTC)}
	// Prices: 1 micro per input token.
	l := ledger.New(srv.JS, ledger.Prices{"m": {InputPerMillion: 1_000_000}}, "USD", ledger.WithClock(clock.Now))
	charge := func(tenant, key string, micros int) ledger.Entry {
		t.Helper()
		e, err := l.Charge(ctx, ledger.ChargeInput{Tenant: tenant, KeyHash: key, JobID: j1, Epoch: 1, Model: "m", InputTokens: micros})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	charge("acme", "april", 5_000) // another month: does not count in May
	clock.Set(time.Date(2026, 5, 2, 9, 0, 0, 0, time.UTC))
	charge("acme", "may1", 600)
	dup := charge("acme", "may2", 300)
	charge("globex", "may3", 990)

	b, err := ledger.NewBudgets(l, ledger.PeriodMonth, map[string]int64{"acme": 1_000, "globex": 1_000}, ledger.WithSettleHold(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	exceeded := func(err error) bool {
		var be *ledger.BudgetError
		return errors.Is(err, ledger.ErrBudgetExceeded) && errors.As(err, &be)
	}

	// acme: 900 spent in May.
	rel50, err := b.Reserve(ctx, "acme", 50)
	if err != nil {
		t.Fatalf("reserve 50 at 900/1000: %v", err)
	}
	if _, err := b.Reserve(ctx, "acme", 60); !exceeded(err) {
		t.Fatalf("reserve 60 at 900+50/1000: %v, want ErrBudgetExceeded", err)
	}
	// Other tenants are unaffected: globex has its own limit, an unlimited tenant has none.
	if _, err := b.Reserve(ctx, "globex", 10); err != nil {
		t.Fatalf("globex reserve 10 at 990/1000: %v", err)
	}
	if rel, err := b.Reserve(ctx, "initech", 1<<40); err != nil {
		t.Fatalf("unlimited tenant refused: %v", err)
	} else {
		rel(1 << 40)
	}

	rel50(0) // the execution produced nothing: its reservation is released
	rel50(0) // twice is harmless
	rel60, err := b.Reserve(ctx, "acme", 60)
	if err != nil {
		t.Fatalf("reserve 60 after the release: %v", err)
	}
	rel60(60) // settled: its cost keeps counting until the ledger shows it (the hold)
	if _, err := b.Reserve(ctx, "acme", 50); !exceeded(err) {
		t.Fatalf("reserve 50 at 900+60 held: %v, want ErrBudgetExceeded", err)
	}
	clock.Add(2 * time.Minute) // the hold ran out (the charge was never written)
	if rel, err := b.Reserve(ctx, "acme", 50); err != nil {
		t.Fatalf("reserve 50 after the hold: %v", err)
	} else {
		rel(0)
	}

	// New ledger entries count at the next Reserve: a charge fills the budget, a reversal frees it.
	charge("acme", "may4", 100)
	if _, err := b.Reserve(ctx, "acme", 1); !exceeded(err) {
		t.Fatalf("reserve 1 at 1000/1000: %v, want ErrBudgetExceeded", err)
	}
	if _, err := l.Reverse(ctx, dup.ID, "refund"); err != nil {
		t.Fatal(err)
	}
	st, err := b.Status(ctx, "acme")
	if err != nil || st.SpentMicros != 700 || !st.Limited {
		t.Fatalf("status %+v, %v; want 700 spent", st, err)
	}

	// A new month starts from zero.
	clock.Set(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	if rel, err := b.Reserve(ctx, "acme", 1_000); err != nil {
		t.Fatalf("reserve the whole limit in June: %v", err)
	} else {
		rel(0)
	}
}

// TestBudgetsConcurrent: concurrent reservations never admit more than the limit.
func TestBudgetsConcurrent(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD")
	b, err := ledger.NewBudgets(l, ledger.PeriodDay, map[string]int64{"acme": 1_000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	var admitted, refused atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.Reserve(ctx, "acme", 100)
			switch {
			case err == nil:
				admitted.Add(1)
			case errors.Is(err, ledger.ErrBudgetExceeded):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 10 || refused.Load() != 30 {
		t.Fatalf("admitted %d, refused %d; want 10 and 30", admitted.Load(), refused.Load())
	}
	if _, err := ledger.NewBudgets(l, "week", nil); !errors.Is(err, ledger.ErrInvalid) {
		t.Fatalf("unknown period: %v, want ErrInvalid", err)
	}
}

// TestSettleHoldEndsWithItsCharge: a settled execution's hold stands in for its charge until
// the ledger shows it, then the charge alone counts (issue 34: both counted, and a tenant was
// refused at half its limit). A hold of another job keeps counting.
func TestSettleHoldEndsWithItsCharge(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, ledger.Prices{"m": {InputPerMillion: 1_000_000}}, "USD") // 1 µ a token
	b, err := ledger.NewBudgets(l, ledger.PeriodMonth, map[string]int64{"acme": 1_000}, ledger.WithSettleHold(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	reserve := func(job string, micros int64) func(int64) {
		t.Helper()
		rel, err := b.ReserveJob(ctx, "acme", job, micros)
		if err != nil {
			t.Fatalf("reserve %d for %s: %v", micros, job, err)
		}
		return rel
	}
	reserve(j1, 100)(600) // j1 settled at 600: its hold counts until its charge is read
	reserve(j2, 100)(100) // j2 settled at 100, never charged here
	if _, err := b.ReserveJob(ctx, "acme", j3, 400); !errors.Is(err, ledger.ErrBudgetExceeded) {
		t.Fatalf("reserve 400 at 700 held: %v, want ErrBudgetExceeded", err)
	}
	if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "m", InputTokens: 600}); err != nil {
		t.Fatal(err)
	}
	st, err := b.Status(ctx, "acme")
	if err != nil || st.SpentMicros != 600 || st.ReservedMicros != 100 {
		t.Fatalf("status %+v, %v; want 600 spent (j1's charge) and 100 held (j2's hold)", st, err)
	}
	reserve(j3, 300)(0) // 600 + 100 + 300 = 1000: admitted once j1 counts once
}
