package resilience

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
)

func TestBackoffWithinBounds(t *testing.T) {
	tests := []struct {
		name       string
		attempt    int
		base, cap  time.Duration
		wantBound  time.Duration // min(cap, base·2^attempt)
		wantSpread bool          // samples must not all be 0
	}{
		{"first retry", 0, 100 * time.Millisecond, 8 * time.Second, 100 * time.Millisecond, true},
		{"second retry", 1, 100 * time.Millisecond, 8 * time.Second, 200 * time.Millisecond, true},
		{"fifth retry", 4, 250 * time.Millisecond, 8 * time.Second, 4 * time.Second, true},
		{"capped", 6, 250 * time.Millisecond, 8 * time.Second, 8 * time.Second, true},
		{"far past the cap (no overflow)", 62, 250 * time.Millisecond, 8 * time.Second, 8 * time.Second, true},
		{"base above cap", 0, 10 * time.Second, time.Second, time.Second, true},
		{"zero base", 3, 0, time.Second, 0, false},
		{"zero cap", 3, time.Second, 0, 0, false},
	}
	const samples = 2000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var max time.Duration
			for range samples {
				d := Backoff(tt.attempt, tt.base, tt.cap)
				if d < 0 || d > tt.wantBound {
					t.Fatalf("Backoff(%d, %v, %v) = %v, want within [0, %v]", tt.attempt, tt.base, tt.cap, d, tt.wantBound)
				}
				max = maxDur(max, d)
			}
			// Full jitter: over 2000 samples the largest is above half the bound (a miss has
			// probability 2^-2000).
			if tt.wantSpread && max <= tt.wantBound/2 {
				t.Errorf("largest of %d samples is %v, want > %v (full jitter)", samples, max, tt.wantBound/2)
			}
		})
	}
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		name   string
		hdr    map[string]string
		want   time.Duration
		wantOK bool
	}{
		{"none", nil, 0, false},
		{"retry-after-ms", map[string]string{"retry-after-ms": "1500"}, 1500 * time.Millisecond, true},
		{"retry-after-ms decimal", map[string]string{"retry-after-ms": "250.5"}, 250500 * time.Microsecond, true},
		{"retry-after-ms wins", map[string]string{"retry-after-ms": "200", "Retry-After": "7"}, 200 * time.Millisecond, true},
		{"bad retry-after-ms falls back", map[string]string{"retry-after-ms": "soon", "Retry-After": "2"}, 2 * time.Second, true},
		{"negative retry-after-ms falls back", map[string]string{"retry-after-ms": "-5", "Retry-After": "3"}, 3 * time.Second, true},
		{"seconds", map[string]string{"Retry-After": "2"}, 2 * time.Second, true},
		{"seconds with spaces", map[string]string{"Retry-After": " 3 "}, 3 * time.Second, true},
		{"zero seconds", map[string]string{"Retry-After": "0"}, 0, true},
		{"decimal seconds", map[string]string{"Retry-After": "0.25"}, 250 * time.Millisecond, true},
		{"decimal seconds 1.5", map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond, true},
		{"HTTP date in 10s", map[string]string{"Retry-After": date(10 * time.Second)}, 10 * time.Second, true},
		{"HTTP date in 2m", map[string]string{"Retry-After": date(2 * time.Minute)}, 2 * time.Minute, true},
		{"HTTP date now", map[string]string{"Retry-After": date(0)}, 0, true},
		{"HTTP date in the past", map[string]string{"Retry-After": date(-time.Hour)}, 0, true},
		{"RFC 850 date", map[string]string{"Retry-After": now.Add(5 * time.Second).Format(time.RFC850)}, 5 * time.Second, true},
		{"garbage", map[string]string{"Retry-After": "tomorrow-ish"}, 0, false},
		{"negative seconds", map[string]string{"Retry-After": "-1"}, 0, false},
		{"empty", map[string]string{"Retry-After": ""}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.hdr {
				h.Set(k, v)
			}
			got, ok := RetryAfter(h, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("RetryAfter(%v) = %v, %v; want %v, %v", tt.hdr, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// fakeClock is a settable clock for Budget.
type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock      { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }
func (c *fakeClock) now() time.Time { return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.t = c.t.Add(d)
}

// allowN asks for n retries and returns how many were allowed.
func allowN(b *Budget, n int) (allowed int) {
	for range n {
		if b.AllowRetry() {
			allowed++
		}
	}
	return allowed
}

func TestBudget(t *testing.T) {
	type step struct {
		advance  time.Duration // clock moves first
		requests int           // then this many first attempts
		tries    int           // then this many retries are asked for
		allowed  int           // and this many are allowed
	}
	tests := []struct {
		name      string
		ratio     float64
		floor     int
		window    time.Duration
		steps     []step
		wantStats BudgetStats
	}{
		{"floor with no traffic", 0.2, 3, 10 * time.Second,
			[]step{{tries: 5, allowed: 3}}, BudgetStats{Requests: 0, Retries: 3, Refused: 2}},
		{"ratio 0.2 of 100 requests", 0.2, 3, 10 * time.Second,
			[]step{{requests: 100, tries: 25, allowed: 20}}, BudgetStats{Requests: 100, Retries: 20, Refused: 5}},
		{"retries spent across calls", 0.2, 3, 10 * time.Second,
			[]step{{requests: 100, tries: 15, allowed: 15}, {advance: time.Second, tries: 10, allowed: 5}},
			BudgetStats{Requests: 100, Retries: 20, Refused: 5}},
		{"floor above ratio", 0.2, 3, 10 * time.Second,
			[]step{{requests: 10, tries: 4, allowed: 3}}, BudgetStats{Requests: 10, Retries: 3, Refused: 1}},
		{"zero ratio keeps the floor", 0, 3, 10 * time.Second,
			[]step{{requests: 1000, tries: 4, allowed: 3}}, BudgetStats{Requests: 1000, Retries: 3, Refused: 1}},
		{"old buckets age out", 0.2, 3, 10 * time.Second,
			[]step{{requests: 100, tries: 20, allowed: 20}, {advance: 11 * time.Second, tries: 5, allowed: 3}},
			BudgetStats{Requests: 100, Retries: 23, Refused: 2}},
		{"half the window ages out", 0.2, 3, 10 * time.Second,
			[]step{{requests: 50}, {advance: 5 * time.Second, requests: 50}, {advance: 5500 * time.Millisecond, tries: 12, allowed: 10}},
			BudgetStats{Requests: 100, Retries: 10, Refused: 2}},
		{"refused retries do not use the budget", 0.2, 0, 10 * time.Second,
			[]step{{requests: 10, tries: 10, allowed: 2}, {requests: 5, tries: 2, allowed: 1}},
			BudgetStats{Requests: 15, Retries: 3, Refused: 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			b := NewBudget(tt.ratio, tt.floor, tt.window, clk.now)
			for i, s := range tt.steps {
				clk.add(s.advance)
				for range s.requests {
					b.Request()
				}
				if got := allowN(b, s.tries); got != s.allowed {
					t.Errorf("step %d: %d of %d retries allowed, want %d", i, got, s.tries, s.allowed)
				}
			}
			if st := b.Stats(); st != tt.wantStats {
				t.Errorf("stats %+v, want %+v", st, tt.wantStats)
			}
		})
	}
}

func TestBreakerTrips(t *testing.T) {
	tests := []struct {
		name     string
		outcomes []bool // true = success, in order
		want     string
	}{
		{"below min requests", []bool{false, false, false}, "closed"},
		{"rate reached at min requests", []bool{true, true, false, false}, "open"},
		{"rate below threshold", []bool{true, true, true, false, true, false, true, true}, "closed"},
		{"all failures", []bool{false, false, false, false}, "open"},
		// The rate is evaluated when a call fails: successes alone never trip it.
		{"evaluated on failure", []bool{false, false, true, true}, "closed"},
		{"evaluated on failure, then trips", []bool{false, false, true, true, false}, "open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBreaker(BreakerConfig{Name: "t", FailureRate: 0.5, MinRequests: 4, Window: 10 * time.Second, OpenFor: time.Hour, Probes: 1}, zerolog.Nop())
			for i, ok := range tt.outcomes {
				done, err := b.Allow(context.Background())
				if err != nil {
					t.Fatalf("call %d refused while %s", i, b.State())
				}
				done(ok)
			}
			if got := b.State(); got != tt.want {
				t.Errorf("state %s, want %s", got, tt.want)
			}
			_, err := b.Allow(context.Background())
			if open := tt.want == "open"; errors.Is(err, ErrOpen) != open {
				t.Errorf("Allow() = %v with state %s", err, tt.want)
			}
			if tt.want == "closed" {
				if req, fail := b.Counts(); int(req) != len(tt.outcomes)+1 || int(fail) != countFalse(tt.outcomes) {
					t.Errorf("counts %d/%d", req, fail)
				}
			}
		})
	}
}

func countFalse(bs []bool) (n int) {
	for _, b := range bs {
		if !b {
			n++
		}
	}
	return n
}

// TestBreakerHalfOpen: open → (open_for) half-open → a probe success closes it, a probe failure
// re-opens it. Short durations and polling; no sleep is an assertion.
func TestBreakerHalfOpen(t *testing.T) {
	for _, probeOK := range []bool{true, false} {
		name := map[bool]string{true: "probe success closes", false: "probe failure re-opens"}[probeOK]
		t.Run(name, func(t *testing.T) {
			const openFor = 50 * time.Millisecond
			b := NewBreaker(BreakerConfig{Name: "t", FailureRate: 0.5, MinRequests: 2, Window: 10 * time.Second, OpenFor: openFor, Probes: 1}, zerolog.Nop())
			tripped := time.Now()
			for range 2 {
				done, err := b.Allow(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				done(false)
			}
			if b.State() != "open" {
				t.Fatalf("state %s after 2/2 failures", b.State())
			}
			if _, err := b.Allow(context.Background()); !errors.Is(err, ErrOpen) {
				t.Fatalf("Allow while open = %v, want ErrOpen", err)
			}
			waitState(t, b, "half-open")
			if since := time.Since(tripped); since < openFor {
				t.Errorf("half-open after %v, before open_for %v", since, openFor)
			}
			probe, err := b.Allow(context.Background())
			if err != nil {
				t.Fatalf("probe refused: %v", err)
			}
			// probes: 1 — a second call while the probe runs is refused.
			if _, err := b.Allow(context.Background()); !errors.Is(err, ErrOpen) {
				t.Errorf("second call during the probe = %v, want ErrOpen", err)
			}
			probe(probeOK)
			if probeOK {
				if b.State() != "closed" {
					t.Fatalf("state %s after a successful probe", b.State())
				}
				done, err := b.Allow(context.Background())
				if err != nil {
					t.Fatalf("closed breaker refused: %v", err)
				}
				done(true)
				return
			}
			if b.State() != "open" {
				t.Fatalf("state %s after a failed probe", b.State())
			}
			if _, err := b.Allow(context.Background()); !errors.Is(err, ErrOpen) {
				t.Errorf("Allow after a failed probe = %v, want ErrOpen", err)
			}
			waitState(t, b, "half-open") // and it tries again after another open_for
		})
	}
}

func waitState(t *testing.T, b *Breaker, want string) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := b.State(); got != want {
			return fmt.Errorf("breaker still %s, want %s", got, want)
		}
		return nil
	})
}

// TestBreakerIgnoresAbandonedCalls: failures of calls whose caller had cancelled them are
// not counted, failures of live calls are.
func TestBreakerIgnoresAbandonedCalls(t *testing.T) {
	for _, cancelled := range []bool{true, false} {
		name := map[bool]string{true: "cancelled calls leave it closed", false: "live failures open it"}[cancelled]
		t.Run(name, func(t *testing.T) {
			b := NewBreaker(BreakerConfig{Name: "t", FailureRate: 0.5, MinRequests: 2, Window: 10 * time.Second, OpenFor: time.Hour, Probes: 1}, zerolog.Nop())
			for range 2 { // MinRequests: two live failures open it
				ctx, cancel := context.WithCancel(context.Background())
				done, err := b.Allow(ctx)
				if err != nil {
					t.Fatalf("refused while %s", b.State())
				}
				if cancelled {
					cancel()
				}
				done(false)
				cancel()
			}
			want := map[bool]string{true: "closed", false: "open"}[cancelled]
			if got := b.State(); got != want {
				t.Errorf("state %s after 2 failed calls (cancelled: %v), want %s", got, cancelled, want)
			}
		})
	}
}
