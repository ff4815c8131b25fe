package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// BudgetError is the error of a refused reservation. It matches ErrBudgetExceeded, and also
// ErrBudgetNoFit while the tenant's spend is below its limit.
type BudgetError struct {
	Tenant         string
	LimitMicros    int64
	SpentMicros    int64 // net spend in the period, from the ledger
	ReservedMicros int64 // outstanding reservations and settle holds of every API node
	EstimateMicros int64
	PeriodStart    time.Time
	// Of a refused Admit: how the estimate's output was sized (OutputFromMaxTokens,
	// OutputFromRecent or OutputFromDefault; "" for Reserve), its output tokens, and the
	// largest max_tokens the request would fit with now (0: none, what remains is in flight or
	// does not cover its input).
	OutputFrom   string
	OutputTokens int
	FitMaxTokens int
}

// How an Admit's estimate sized the request's output (BudgetError.OutputFrom).
const (
	OutputFromMaxTokens = "max_tokens" // the request's own bound
	OutputFromRecent    = "recent"     // the most the model's latest answers returned (Outputs)
	OutputFromDefault   = "default"    // the configured default: too few answers of the model seen
)

func (e *BudgetError) Error() string {
	what := "budget exceeded"
	if e.SpentMicros < e.LimitMicros {
		what = "the estimate does not fit in what remains"
	}
	return fmt.Sprintf("ledger: %s: spent %s + reserved %s + estimate %s > limit %s (period from %s)", what,
		FormatMicros(e.SpentMicros), FormatMicros(e.ReservedMicros), FormatMicros(e.EstimateMicros),
		FormatMicros(e.LimitMicros), e.PeriodStart.Format(time.RFC3339))
}

// Unwrap makes a BudgetError match ErrBudgetExceeded, and ErrBudgetNoFit below the limit.
func (e *BudgetError) Unwrap() []error {
	if e.SpentMicros < e.LimitMicros {
		return []error{ErrBudgetNoFit, ErrBudgetExceeded}
	}
	return []error{ErrBudgetExceeded}
}

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

// WithBudgetClock sets the clock that decides the current period and the reservations'
// expiry (default: the ledger's).
func WithBudgetClock(now func() time.Time) BudgetOption { return func(b *Budgets) { b.now = now } }

// WithOutputs sets the estimator of Admit's requests without max_tokens, and feeds it every
// entry the budgets read (default: none, every such request is sized by its default).
func WithOutputs(o *Outputs) BudgetOption { return func(b *Budgets) { b.outputs = o } }

// WithSettleHold sets how long a released reservation's actual cost keeps counting.
func WithSettleHold(d time.Duration) BudgetOption { return func(b *Budgets) { b.hold = d } }

// Budgets enforces optional per-tenant spend limits per period, across every API node that
// shares the NATS cluster. A request is admitted only if the tenant's net spend in the
// current period (charges and continuations minus reversals with Time in the period, read
// from the ledger) plus the outstanding reservations of all nodes plus its estimate stays
// within the limit. Tenants without a limit are never refused.
//
// Reserve then settle. The reservations live in BudgetBucket, one key per tenant holding the
// list of its reservations, each with an id, an amount and an expiry. Reserve reads the list,
// drops what expired, checks the sum and appends its estimate with a compare-and-set write
// (Create, or Update at the revision read); on a conflict it reads again, so two nodes can
// never both admit against the same remainder. Within a process a tenant's admissions are
// serialized, so conflicts only come from other nodes. The release replaces the reservation,
// in one compare-and-set, with a settle hold of the actual cost.
//
// The hold. The ledger charge of an execution is written off the request's critical path (by
// its worker); until it is, the hold (default 30 s) stands in for it. A hold names its job
// (ReserveJob), and once the tenant's entries read show a charge of that job the hold stops
// counting: the cost counts once (issue 34: while both counted, a tenant was refused at half
// its limit). A hold without a job (Reserve) counts until it expires. The ledger is the truth
// of what was spent; the bucket only holds what is in flight.
//
// Expiry. A node renews its live reservations every TTL/4 (DefaultReservationTTL, 1 minute);
// one that lapsed while NATS was unreachable is put back by the next renewal. A node that dies
// stops renewing: its reservations stop counting within the TTL, so a crash blocks at most
// what that node had in flight, for at most a minute. Renewal ends at release, or after
// DefaultReservationMax for a reservation never released.
//
// What can overshoot the limit, and by how much:
//   - an execution still running when its reservation stopped counting: its node died (the
//     execution goes on on a worker) or could not renew for a whole TTL, or its node's clock
//     is behind another's by more than TTL·3/4: at most that reservation's estimate, until its
//     charge reaches the ledger;
//   - a charge written more than the settle hold after its release (an async job released at
//     acceptance, an execution that outlives the request that started it): at most its actual
//     cost, until the charge reaches the ledger;
//   - an execution that costs more than its estimate: the difference. Admit's estimate is an
//     upper bound only for a request with max_tokens (but for its input, estimated at 4 bytes a
//     token); without one it is the most the model's latest answers returned (Outputs), which
//     a longer answer passes.
//
// A release whose write fails (NATS unavailable) leaves the reservation in the bucket, where
// it expires within the TTL (at least the hold, and an estimate ≥ the actual cost in the
// usual case). The net spend is cached per tenant and period: the first Reserve of a tenant
// reads its entries stored since the current period began (by the server's clock, less an
// hour), later ones only the new entries (one read when nothing is new); an entry counts in
// the period of its Time.
type Budgets struct {
	l        *Ledger   // the first of parts: its JetStream, prices, clock and logger
	parts    []*Ledger // the ledgers whose entries count: every partition's
	period   Period
	limits   map[string]int64
	now      func() time.Time
	hold     time.Duration
	ttl      time.Duration
	maxHold  time.Duration
	replicas int
	outputs  *Outputs // nil: Admit sizes a request without max_tokens by its default

	kvMu sync.Mutex
	kv   jetstream.KeyValue // nil until first used, and after a NATS failure

	mu      sync.Mutex
	tenants map[string]*tenantBudget
	closed  atomic.Bool
	renews  sync.WaitGroup // armed renewal timers and running renewals
}

type tenantBudget struct {
	mu    chanMutex           // serializes refresh, admission, release and renewal for the tenant
	key   string              // in BudgetBucket
	read  []partRead          // how far each partition's entries of the tenant were counted
	spent map[time.Time]int64 // net spend by period start, over every partition (entries read once, incrementally)
	// charged are the jobs with a charge among the entries counted, and its time: what a
	// settle hold of the job no longer needs to stand in for. Kept for a hold and a minute.
	charged map[string]time.Time
	held    map[string]held // this process's unreleased reservations, by id
	timer   *time.Timer     // renews held; nil when nothing is held
	gen     uint64          // which timer is current (a stopped one may still fire)
}

// partRead is how far a tenant's entries in one partition were counted.
type partRead struct {
	loaded  bool
	lastSeq uint64 // last ledger entry of the tenant counted
}

// isCharged reports whether the entries counted hold a charge of job. The caller holds tb.mu.
func (tb *tenantBudget) isCharged(job string) bool {
	_, ok := tb.charged[job]
	return ok
}

// held is a reservation this process holds and renews.
type held struct {
	micros int64
	since  time.Time
}

// NewBudgets enforces limits (tenant -> micro-units per period) over l's entries, with the
// reservations in BudgetBucket on l's JetStream (created on first use). The limits map is
// read, never written. Close stops renewing this process's reservations. Set.Budgets is
// the same over every partition of a Set.
func NewBudgets(l *Ledger, period Period, limits map[string]int64, opts ...BudgetOption) (*Budgets, error) {
	return newBudgets(&Set{parts: []*Ledger{l}}, period, limits, opts...)
}

// newBudgets is NewBudgets over the ledgers of s.
func newBudgets(s *Set, period Period, limits map[string]int64, opts ...BudgetOption) (*Budgets, error) {
	if !period.Valid() {
		return nil, fmt.Errorf("ledger: budgets: %w: period %q (day or month)", ErrInvalid, period)
	}
	l := s.parts[0]
	b := &Budgets{l: l, parts: s.parts, period: period, limits: limits, now: l.now, hold: DefaultSettleHold, ttl: DefaultReservationTTL,
		maxHold: DefaultReservationMax, tenants: map[string]*tenantBudget{}}
	for _, o := range opts {
		o(b)
	}
	if b.ttl <= 0 {
		return nil, fmt.Errorf("ledger: budgets: %w: reservation TTL %s", ErrInvalid, b.ttl)
	}
	return b, nil
}

func (b *Budgets) tenant(t string) *tenantBudget {
	b.mu.Lock()
	defer b.mu.Unlock()
	tb := b.tenants[t]
	if tb == nil {
		tb = &tenantBudget{mu: make(chanMutex, 1), key: reservationKey(t), read: make([]partRead, len(b.parts)),
			spent: map[time.Time]int64{}, held: map[string]held{}, charged: map[string]time.Time{}}
		b.tenants[strings.Clone(t)] = tb // kept: never a caller's borrowed bytes
	}
	return tb
}

// budgetMargin is how long before its period's start a budget's first read of a tenant starts
// (by the server's store time), for entries stamped by a clock ahead of the server's.
const budgetMargin = time.Hour

// refresh counts the tenant's entries appended since the last refresh, in every partition;
// the first time, those stored since the current period started (less a margin). The caller
// holds tb.mu.
//
// A tenant's spend is the sum over the partitions, each read up to its head of the moment:
// a charge appended to a partition after its read is not counted yet, and its settle hold
// (or reservation) still is, since a hold stops counting only once its charge was read.
func (b *Budgets) refresh(ctx context.Context, tenant string, tb *tenantBudget, now time.Time) error {
	defer func() { // forget what no live hold can name any more
		for job, at := range tb.charged {
			if now.Sub(at) > b.hold+time.Minute {
				delete(tb.charged, job)
			}
		}
	}()
	for i, l := range b.parts {
		if err := b.refreshPart(ctx, l, l.subject(tenant), tb, &tb.read[i], now); err != nil {
			return err
		}
	}
	return nil
}

// refreshPart counts the entries on subject of l's stream appended since pr.lastSeq (refresh).
func (b *Budgets) refreshPart(ctx context.Context, l *Ledger, subject string, tb *tenantBudget, pr *partRead, now time.Time) error {
	count := func(e *Entry) error {
		pr.lastSeq = e.Seq
		tb.spent[b.period.start(e.Time)] += e.Signed()
		b.outputs.Observe(e)
		if e.Kind == KindCharge && e.JobID != "" {
			tb.charged[e.JobID] = e.Time
		}
		return nil
	}
	if pr.loaded {
		return l.follow(ctx, subject, pr.lastSeq+1, 0, count)
	}
	st, err := l.stream(ctx)
	if err != nil {
		return err
	}
	var head uint64
	if st != nil {
		if head, _, err = l.last(ctx, st, subject); err != nil {
			return err
		}
	}
	since := b.period.start(now).Add(-budgetMargin)
	if err := l.scan(ctx, subject, span{since: since, end: head}, count); err != nil {
		return err
	}
	pr.lastSeq, pr.loaded = head, true
	return nil
}

// Reserve admits a request of tenant estimated to cost estimateMicros, or returns a
// *BudgetError (ErrBudgetExceeded), or ErrBudgetUnavailable when the shared reservations
// could not be changed. Call release exactly once when the execution is settled, with its
// actual cost (0 if it produced none); later calls do nothing. A tenant without a limit is
// admitted without reading the ledger.
func (b *Budgets) Reserve(ctx context.Context, tenant string, estimateMicros int64) (release func(actualMicros int64), err error) {
	return b.ReserveJob(ctx, tenant, "", estimateMicros)
}

// ReserveJob is Reserve for the execution of job jobID: its settle hold names the job, and
// stops counting once the ledger shows the job's charge.
func (b *Budgets) ReserveJob(ctx context.Context, tenant, jobID string, estimateMicros int64) (release func(actualMicros int64), err error) {
	_, release, err = b.reserve(ctx, tenant, jobID, func() sizing { return sizing{micros: estimateMicros} })
	return release, err
}

// Ask is what a new execution asks of its tenant's budget (Admit).
type Ask struct {
	JobID       string
	Model       string
	InputTokens int
	// MaxTokens bounds the output (the request's max_tokens); 0 when the request sets none.
	MaxTokens int
	// DefaultMaxTokens sizes the output of a request without MaxTokens while the model's
	// recent answers are too few to estimate from (ledger.default_max_tokens).
	DefaultMaxTokens int
}

// Admit is ReserveJob for ask, priced with the ledger's prices after the tenant's new entries
// were read: its input and its max_tokens, or for a request without max_tokens the most the
// model's latest answers returned (WithOutputs; the default while too few were seen). It
// returns what it reserved, which release's settle hold should hold too. A refusal below the
// limit (ErrBudgetNoFit) says how the output was sized and the max_tokens that would fit.
//
// An answer longer than its estimate (a request without max_tokens, whose model returned more
// than in its latest answers) is charged in full: the tenant's spend can pass the limit by the
// difference. A request with max_tokens cannot, but for its input, estimated at 4 bytes a
// token.
func (b *Budgets) Admit(ctx context.Context, tenant string, ask Ask) (reserved int64, release func(actualMicros int64), err error) {
	prices := b.l.prices
	return b.reserve(ctx, tenant, ask.JobID, func() sizing {
		out, from := ask.MaxTokens, OutputFromMaxTokens
		if out <= 0 {
			out, from = ask.DefaultMaxTokens, OutputFromDefault
			if n, ok := b.outputs.Estimate(ask.Model); ok {
				out, from = n, OutputFromRecent
			}
		}
		cost := func(out int) int64 { return prices.Cost(ask.Model, ask.InputTokens, out) }
		return sizing{micros: cost(out), from: from, out: out, fit: func(room int64) int {
			// The largest output below out that costs at most room (the cost grows with it).
			return sort.Search(out, func(n int) bool { return cost(n+1) > room })
		}}
	})
}

// sizing is a reservation's estimate, and for Admit how it was made.
type sizing struct {
	micros int64
	from   string
	out    int
	fit    func(room int64) int // the largest max_tokens whose estimate fits in room; nil: Reserve
}

// reserve admits the estimate size makes once the tenant's new entries are counted
// (ReserveJob, Admit), or returns a *BudgetError.
func (b *Budgets) reserve(ctx context.Context, tenant, jobID string, size func() sizing) (estimateMicros int64, release func(actualMicros int64), err error) {
	limit, limited := b.limits[tenant]
	if !limited {
		return 0, func(int64) {}, nil
	}
	tb := b.tenant(tenant)
	if err := tb.mu.LockCtx(ctx); err != nil {
		return 0, nil, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	defer tb.mu.Unlock()
	now := b.now()
	if err := b.refresh(ctx, tenant, tb, now); err != nil {
		return 0, nil, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	sz := size()
	estimateMicros = max(sz.micros, 0)
	ps := b.period.start(now)
	spent := tb.spent[ps]
	id := newReservationID()
	err = b.change(ctx, tb.key, func(rs *reservations, now time.Time) (bool, error) {
		reserved := rs.live(now, tb.isCharged)
		if rs.find(id) >= 0 {
			return false, nil // an earlier try was written; its answer was lost
		}
		if spent+reserved+estimateMicros > limit {
			be := &BudgetError{Tenant: tenant, LimitMicros: limit, SpentMicros: spent, ReservedMicros: reserved,
				EstimateMicros: estimateMicros, PeriodStart: ps, OutputFrom: sz.from, OutputTokens: sz.out}
			if room := limit - spent - reserved; sz.fit != nil && room > 0 {
				be.FitMaxTokens = sz.fit(room)
			}
			return false, be
		}
		if estimateMicros == 0 {
			return false, nil // nothing to hold
		}
		rs.List = append(rs.List, reservation{ID: id, Micros: estimateMicros, Until: now.Add(b.ttl).UnixMilli()})
		return true, nil
	})
	if err != nil {
		if errors.Is(err, ErrBudgetExceeded) {
			return 0, nil, err
		}
		return 0, nil, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	if estimateMicros > 0 {
		tb.held[id] = held{micros: estimateMicros, since: now}
		b.arm(tenant, tb)
	}
	var once sync.Once
	return estimateMicros, func(actualMicros int64) {
		once.Do(func() { b.settle(tenant, tb, id, jobID, actualMicros) })
	}, nil
}

// settleTimeout bounds a release's write (it has no caller context); it rides out an election.
const settleTimeout = 10 * time.Second

// settle replaces reservation id with a settle hold of actualMicros.
func (b *Budgets) settle(tenant string, tb *tenantBudget, id, jobID string, actualMicros int64) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	delete(tb.held, id)
	if len(tb.held) == 0 {
		b.disarm(tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	err := b.change(ctx, tb.key, func(rs *reservations, now time.Time) (bool, error) {
		rs.live(now, tb.isCharged)
		i := rs.find(id)
		if i >= 0 && rs.List[i].Settled {
			return false, nil // an earlier try was written
		}
		if i >= 0 {
			rs.List = append(rs.List[:i], rs.List[i+1:]...)
		}
		hold := actualMicros > 0 && b.hold > 0
		if hold {
			rs.List = append(rs.List, reservation{ID: id, Micros: actualMicros, Until: now.Add(b.hold).UnixMilli(), Settled: true, Job: jobID})
		}
		return i >= 0 || hold, nil
	})
	if err != nil {
		b.l.log.Warn().Err(err).Str(fieldTenant, tenant).Msg("releasing a budget reservation; it expires by itself")
	}
}

// arm schedules the renewal of tb's held reservations, unless it is scheduled. The caller
// holds tb.mu.
func (b *Budgets) arm(tenant string, tb *tenantBudget) {
	if tb.timer != nil || len(tb.held) == 0 || b.closed.Load() {
		return
	}
	tb.gen++
	gen := tb.gen
	b.renews.Add(1)
	tb.timer = time.AfterFunc(b.ttl/4, func() {
		defer b.renews.Done()
		b.renew(tenant, tb, gen)
	})
}

// disarm cancels a scheduled renewal. The caller holds tb.mu.
func (b *Budgets) disarm(tb *tenantBudget) {
	if tb.timer != nil && tb.timer.Stop() {
		b.renews.Done() // it will not run
	}
	tb.timer = nil
}

// renewTimeout bounds one renewal; a failed one is tried again at the next period.
const renewTimeout = 5 * time.Second

// renew extends the expiry of this process's held reservations of tenant, and puts back one
// that lapsed meanwhile (its execution still runs, so it still counts).
func (b *Budgets) renew(tenant string, tb *tenantBudget, gen uint64) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.gen != gen || tb.timer == nil {
		return // disarmed, or replaced, after this one fired
	}
	tb.timer = nil
	now := b.now()
	for id, h := range tb.held {
		if now.Sub(h.since) > b.maxHold {
			delete(tb.held, id) // never released: let it expire
		}
	}
	if len(tb.held) == 0 || b.closed.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
	defer cancel()
	err := b.change(ctx, tb.key, func(rs *reservations, now time.Time) (bool, error) {
		rs.live(now, tb.isCharged)
		until := now.Add(b.ttl).UnixMilli()
		for id, h := range tb.held {
			switch i := rs.find(id); {
			case i < 0:
				rs.List = append(rs.List, reservation{ID: id, Micros: h.micros, Until: until})
			case !rs.List[i].Settled:
				rs.List[i].Until = until
			}
		}
		return true, nil
	})
	if err != nil {
		if b.l.js.Conn().IsClosed() {
			return // this process is going away: so are its reservations, within the TTL
		}
		b.l.log.Warn().Err(err).Str(fieldTenant, tenant).Msg("renewing budget reservations")
	}
	b.arm(tenant, tb)
}

// Close stops renewing this process's reservations (they expire within the TTL unless
// released) and waits for a renewal under way. Reserve keeps working, without renewals.
func (b *Budgets) Close() {
	b.closed.Store(true)
	b.mu.Lock()
	tbs := slices.Collect(maps.Values(b.tenants))
	b.mu.Unlock()
	for _, tb := range tbs {
		tb.mu.Lock()
		b.disarm(tb)
		tb.mu.Unlock()
	}
	b.renews.Wait()
}

// Status reports tenant's spend, the reservations of all nodes, and its limit in the current
// period.
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
	var reserved int64
	if err := b.change(ctx, tb.key, func(rs *reservations, now time.Time) (bool, error) {
		reserved = rs.live(now, tb.isCharged)
		return false, nil
	}); err != nil {
		return BudgetStatus{}, fmt.Errorf("ledger: budget of %s: %w", tenant, err)
	}
	ps := b.period.start(now)
	return BudgetStatus{Tenant: tenant, Limited: limited, LimitMicros: limit, SpentMicros: tb.spent[ps],
		ReservedMicros: reserved, PeriodStart: ps}, nil
}
