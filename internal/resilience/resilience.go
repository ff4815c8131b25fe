// Package resilience holds the mechanisms that keep calls to slow, expensive, sometimes broken
// model backends from making an outage worse: exponential backoff with full jitter,
// Retry-After parsing, a sliding-window retry budget, and a circuit breaker (sony/gobreaker)
// per backend. Every type is safe for concurrent use.
package resilience

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/sony/gobreaker/v2"
)

// Backoff is the delay before retry number attempt (0-based): full jitter over
// min(cap, base·2^attempt).
func Backoff(attempt int, base, cap time.Duration) time.Duration {
	d := base
	for i := 0; i < attempt && d < cap; i++ {
		d *= 2
	}
	if d > cap {
		d = cap
	}
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1)) // #nosec G404 -- backoff jitter, not a secret
}

// RetryAfter reads a server's requested delay: retry-after-ms (milliseconds) first, then
// Retry-After as seconds (integer or decimal) or an HTTP date.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d, true
		}
		return 0, true
	}
	return 0, false
}

// Budget caps retries at a fraction of requests over a sliding window (with a small floor,
// so a quiet backend can still retry), so retries never multiply an outage.
type Budget struct {
	ratio  float64
	floor  int
	bucket time.Duration
	now    func() time.Time

	mu       sync.Mutex
	slots    []budgetSlot
	refused  int64
	retried  int64
	requests int64
}

type budgetSlot struct {
	at                time.Time
	requests, retries int
}

// NewBudget allows retries up to ratio × requests seen in the last window, and at least floor.
func NewBudget(ratio float64, floor int, window time.Duration, now func() time.Time) *Budget {
	if now == nil {
		now = time.Now
	}
	const buckets = 10
	return &Budget{ratio: ratio, floor: floor, bucket: window / buckets, now: now, slots: make([]budgetSlot, buckets)}
}

func (b *Budget) slot() *budgetSlot {
	now := b.now().Truncate(b.bucket)
	i := int(now.UnixNano()/int64(b.bucket)) % len(b.slots)
	if !b.slots[i].at.Equal(now) {
		b.slots[i] = budgetSlot{at: now}
	}
	return &b.slots[i]
}

func (b *Budget) totals() (requests, retries int) {
	oldest := b.now().Add(-b.bucket * time.Duration(len(b.slots)))
	for _, s := range b.slots {
		if s.at.After(oldest) {
			requests += s.requests
			retries += s.retries
		}
	}
	return requests, retries
}

// Request counts a first attempt.
func (b *Budget) Request() {
	b.mu.Lock()
	b.slot().requests++
	b.requests++
	b.mu.Unlock()
}

// AllowRetry reports whether one more retry fits the budget, and counts it if so (a refusal
// is counted too).
func (b *Budget) AllowRetry() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	req, ret := b.totals()
	limit := int(b.ratio * float64(req))
	if limit < b.floor {
		limit = b.floor
	}
	if ret+1 > limit {
		b.refused++
		return false
	}
	b.slot().retries++
	b.retried++
	return true
}

// BudgetStats are lifetime counters.
type BudgetStats struct {
	Requests int64 `json:"requests"`
	Retries  int64 `json:"retries"`
	Refused  int64 `json:"retries_refused"`
}

// Stats returns lifetime counters.
func (b *Budget) Stats() BudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetStats{Requests: b.requests, Retries: b.retried, Refused: b.refused}
}

// ErrOpen is returned by Breaker.Allow while the breaker is open (or half-open and full).
var ErrOpen = errors.New("resilience: circuit breaker open")

// BreakerConfig configures a Breaker.
type BreakerConfig struct {
	Name        string
	FailureRate float64
	MinRequests int
	Window      time.Duration
	OpenFor     time.Duration
	Probes      int
	// OnChange, when set, is told each state the breaker enters ("closed", "half-open", "open").
	OnChange func(to string)
}

// Breaker is a circuit breaker over a rolling window: it opens when failures/requests reach
// FailureRate with at least MinRequests in the window, stays open for OpenFor, then lets
// Probes requests through; their outcome closes or re-opens it.
type Breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

// NewBreaker makes a Breaker whose state changes are logged.
func NewBreaker(cfg BreakerConfig, log zerolog.Logger) *Breaker {
	bucket := cfg.Window / 10
	if bucket <= 0 {
		bucket = time.Second
	}
	st := gobreaker.Settings{
		Name:         cfg.Name,
		MaxRequests:  uint32(cfg.Probes),
		Interval:     cfg.Window,
		BucketPeriod: bucket,
		Timeout:      cfg.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= uint32(cfg.MinRequests) && float64(c.TotalFailures) >= cfg.FailureRate*float64(c.Requests)
		},
		IsExcluded: func(err error) bool { return errors.Is(err, errCallAbandoned) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			log.Warn().Str("backend", name).Str("from", from.String()).Str("to", to.String()).Msg("circuit breaker state change")
			if cfg.OnChange != nil {
				cfg.OnChange(to.String())
			}
		},
	}
	return &Breaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](st)}
}

// Allow asks to make one call under ctx; done must be called with its outcome. ErrOpen means:
// do not call this backend now. A call that failed once ctx had ended says nothing about the
// backend (the caller cancelled it: its execution was fenced, its lease lost, the worker is
// stopping) and is counted neither way; without that, a few fenced executions opened the
// breaker of a healthy backend (seen in the fault suite's row 1b).
func (b *Breaker) Allow(ctx context.Context) (done func(ok bool), err error) {
	d, err := b.cb.Allow()
	if err != nil {
		return nil, ErrOpen
	}
	return func(ok bool) {
		switch {
		case ok:
			d(nil)
		case ctx.Err() != nil:
			d(errCallAbandoned)
		default:
			d(errCallFailed)
		}
	}, nil
}

var (
	errCallFailed    = errors.New("call failed")
	errCallAbandoned = errors.New("call abandoned by its caller")
)

// State is "closed", "half-open" or "open".
func (b *Breaker) State() string { return b.cb.State().String() }

// Counts are the breaker's current window counts.
func (b *Breaker) Counts() (requests, failures uint32) {
	c := b.cb.Counts()
	return c.Requests, c.TotalFailures
}
