package ledger

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Period is the span a budget limit applies to, in UTC calendar terms.
type Period string

// Periods.
const (
	PeriodDay   Period = "day"
	PeriodMonth Period = "month"
)

// start is the beginning of the period containing t (UTC).
func (p Period) start(t time.Time) time.Time {
	t = t.UTC()
	if p == PeriodDay {
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	}
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// Valid reports whether p is a known period.
func (p Period) Valid() bool { return p == PeriodDay || p == PeriodMonth }

// DefaultSettleHold is how long a settled cost keeps counting after release (see Budgets).
const DefaultSettleHold = 30 * time.Second

// BudgetError is the error of a refused reservation; it matches ErrBudgetExceeded.
type BudgetError struct {
	Tenant         string
	LimitMicros    int64
	SpentMicros    int64 // net spend in the period, from the ledger
	ReservedMicros int64 // outstanding reservations and settling costs in this process
	EstimateMicros int64
	PeriodStart    time.Time
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("ledger: budget exceeded: spent %s + reserved %s + estimate %s > limit %s (period from %s)",
		FormatMicros(e.SpentMicros), FormatMicros(e.ReservedMicros), FormatMicros(e.EstimateMicros),
		FormatMicros(e.LimitMicros), e.PeriodStart.Format(time.RFC3339))
}

// Unwrap makes a BudgetError match ErrBudgetExceeded.
func (e *BudgetError) Unwrap() error { return ErrBudgetExceeded }

// BudgetStatus is a tenant's position against its limit.
type BudgetStatus struct {
	Tenant         string    `json:"tenant"`
	Limited        bool      `json:"limited"`
	LimitMicros    int64     `json:"limit_micros"`
	SpentMicros    int64     `json:"spent_micros"`
	ReservedMicros int64     `json:"reserved_micros"`
	PeriodStart    time.Time `json:"period_start"`
}

// BudgetOption configures Budgets.
type BudgetOption func(*Budgets)

// WithBudgetClock sets the clock that decides the current period (default: the ledger's).
func WithBudgetClock(now func() time.Time) BudgetOption { return func(b *Budgets) { b.now = now } }

// WithSettleHold sets how long a released reservation's actual cost keeps counting.
func WithSettleHold(d time.Duration) BudgetOption { return func(b *Budgets) { b.hold = d } }

// Budgets enforces optional per-tenant spend limits per period. A request is admitted only if
// the tenant's net spend in the current period (charges and continuations minus reversals with
// Time in the period, read from the ledger) plus this process's outstanding reservations plus
// its estimate stays within the limit. Tenants without a limit are never refused.
//
// The net spend is cached per tenant and period: the first Reserve of a tenant reads its
// entries stored since the current period began (by the server's clock, less an hour), later
// ones only the new entries (one read when nothing is new); an entry counts in the period of
// its Time. Released costs keep counting for the settle hold (default
// 30 s) because the ledger charge of an execution is written off the request's critical path:
// until it is, the hold stands in for it; meanwhile a cost may count twice, which errs on the
// side of refusing. Reservations are per process: several API processes each admit up to the
// limit against the same ledger spend, so a limit can be overshot by what is in flight.
type Budgets struct {
	l      *Ledger
	period Period
	limits map[string]int64
	now    func() time.Time
	hold   time.Duration

	mu      sync.Mutex
	tenants map[string]*tenantBudget
}

type tenantBudget struct {
	mu       chanMutex // serializes refresh + admission for the tenant
	loaded   bool
	lastSeq  uint64              // last ledger entry of the tenant counted
	spent    map[time.Time]int64 // net spend by period start (entries read once, incrementally)
	reserved int64
	settling []settle
}

type settle struct {
	micros int64
	until  time.Time
}

// NewBudgets enforces limits (tenant -> micro-units per period) over l's entries. The limits
// map is read, never written.
func NewBudgets(l *Ledger, period Period, limits map[string]int64, opts ...BudgetOption) (*Budgets, error) {
	if !period.Valid() {
		return nil, fmt.Errorf("ledger: budgets: %w: period %q (day or month)", ErrInvalid, period)
	}
	b := &Budgets{l: l, period: period, limits: limits, now: l.now, hold: DefaultSettleHold, tenants: map[string]*tenantBudget{}}
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

func (b *Budgets) tenant(t string) *tenantBudget {
	b.mu.Lock()
	defer b.mu.Unlock()
	tb := b.tenants[t]
	if tb == nil {
		tb = &tenantBudget{mu: make(chanMutex, 1), spent: map[time.Time]int64{}}
		b.tenants[strings.Clone(t)] = tb // kept: never a caller's borrowed bytes
	}
	return tb
}

// budgetMargin is how long before its period's start a budget's first read of a tenant starts
// (by the server's store time), for entries stamped by a clock ahead of the server's.
const budgetMargin = time.Hour

// refresh counts the tenant's entries appended since the last refresh; the first time, those
// stored since the current period started (less a margin). The caller holds tb.mu.
func (b *Budgets) refresh(ctx context.Context, tenant string, tb *tenantBudget, now time.Time) error {
	count := func(e *Entry) error {
		tb.lastSeq = e.Seq
		tb.spent[b.period.start(e.Time)] += e.Signed()
		return nil
	}
	subject := Subject(tenant)
	if tb.loaded {
		return b.l.follow(ctx, subject, tb.lastSeq+1, count)
	}
	st, err := b.l.stream(ctx)
	if err != nil {
		return err
	}
	var head uint64
	if st != nil {
		if head, _, err = last(ctx, st, subject); err != nil {
			return err
		}
	}
	since := b.period.start(now).Add(-budgetMargin)
	if err := b.l.scan(ctx, subject, span{since: since, end: head}, count); err != nil {
		return err
	}
	tb.lastSeq, tb.loaded = head, true
	return nil
}

// holding sums the settle holds still running at now, dropping the others.
func (tb *tenantBudget) holding(now time.Time) int64 {
	var sum int64
	kept := tb.settling[:0]
	for _, s := range tb.settling {
		if now.Before(s.until) {
			kept = append(kept, s)
			sum += s.micros
		}
	}
	tb.settling = kept
	return sum
}

// Reserve admits a request of tenant estimated to cost estimateMicros, or returns a
// *BudgetError (ErrBudgetExceeded). Call release exactly once when the execution is settled,
// with its actual cost (0 if it produced none); later calls do nothing. A tenant without a
// limit is admitted without reading the ledger.
func (b *Budgets) Reserve(ctx context.Context, tenant string, estimateMicros int64) (release func(actualMicros int64), err error) {
	limit, limited := b.limits[tenant]
	if !limited {
		return func(int64) {}, nil
	}
	if estimateMicros < 0 {
		estimateMicros = 0
	}
	tb := b.tenant(tenant)
	if err := tb.mu.LockCtx(ctx); err != nil {
		return nil, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	defer tb.mu.Unlock()
	now := b.now()
	if err := b.refresh(ctx, tenant, tb, now); err != nil {
		return nil, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	ps := b.period.start(now)
	spent, reserved := tb.spent[ps], tb.reserved+tb.holding(now)
	if spent+reserved+estimateMicros > limit {
		return nil, &BudgetError{Tenant: tenant, LimitMicros: limit, SpentMicros: spent, ReservedMicros: reserved,
			EstimateMicros: estimateMicros, PeriodStart: ps}
	}
	tb.reserved += estimateMicros
	var once sync.Once
	return func(actualMicros int64) {
		once.Do(func() {
			tb.mu.Lock()
			defer tb.mu.Unlock()
			tb.reserved -= estimateMicros
			if actualMicros > 0 && b.hold > 0 {
				tb.settling = append(tb.settling, settle{micros: actualMicros, until: b.now().Add(b.hold)})
			}
		})
	}, nil
}

// Status reports tenant's spend, reservations and limit in the current period.
func (b *Budgets) Status(ctx context.Context, tenant string) (BudgetStatus, error) {
	limit, limited := b.limits[tenant]
	tb := b.tenant(tenant)
	if err := tb.mu.LockCtx(ctx); err != nil {
		return BudgetStatus{}, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	defer tb.mu.Unlock()
	now := b.now()
	if err := b.refresh(ctx, tenant, tb, now); err != nil {
		return BudgetStatus{}, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	ps := b.period.start(now)
	return BudgetStatus{Tenant: tenant, Limited: limited, LimitMicros: limit, SpentMicros: tb.spent[ps],
		ReservedMicros: tb.reserved + tb.holding(now), PeriodStart: ps}, nil
}
