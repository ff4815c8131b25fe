// Package telemetry owns oncegate's Prometheus metrics: one Metrics per gateway process, with
// its own registry (never prometheus.DefaultRegisterer), every collector of the metric
// contract, the small methods the rooms call where they decide something, and the /metrics
// handler.
//
// Labels are bounded by construction: a tenant is a configured tenant id (or anonymous), a
// model a configured model name (anything else is "other"), a backend a configured backend
// name (anything else "other"); the other labels are enums of this package. No label ever
// holds a key, a job id or a raw client string.
//
// The request path stays cheap: a label set's child is resolved once (WithLabelValues on first
// use) and kept in a table indexed by the enums, so a call is a map look-up at most, an atomic
// load and an atomic add, without allocation.
//
// Every method is safe for concurrent use, and every method of a nil *Metrics does nothing, so
// rooms built without metrics (tests, tools) need no checks.
package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oncegate/oncegate/internal/partition"
)

const namespace = "oncegate"

// Bounded label values besides the configured names.
const (
	Anonymous = "anonymous" // the tenant when no tenants are configured
	Other     = "other"     // a model or backend that is not configured
)

// Route is the route label of oncegate_requests_total.
type Route uint8

// Routes.
const (
	RouteChat        Route = iota // POST /v1/chat/completions
	RouteMessages                 // POST /v1/messages
	RouteJobs                     // POST /v1/jobs, job lists, cancels
	RouteJobEvents                // GET /v1/jobs/{id}/events
	RouteJobGet                   // GET /v1/jobs/{id}
	RouteResponses                // POST /v1/responses, and a response's retrieve and cancel
	RouteEmbeddings               // POST /v1/embeddings
	RoutePassthrough              // POST to a path a backend lists in its passthrough
	RouteOther
	numRoutes
)

var routeNames = [numRoutes]string{"chat", "messages", "jobs", "job_events", "job_get", "responses", "embeddings", "passthrough", "other"}

// String is the route's label value.
func (r Route) String() string { return routeNames[min(r, RouteOther)] }

// API is the api label: the wire format of a request.
type API uint8

// APIs.
const (
	APIOpenAI API = iota
	APIAnthropic
	APIJobs
	numAPIs
)

var apiNames = [numAPIs]string{"openai", "anthropic", "jobs"}

// String is the API's label value.
func (a API) String() string { return apiNames[min(a, APIJobs)] }

// APIOf is the API of a wire-format name ("openai", "anthropic"); anything else is jobs.
func APIOf(s string) API {
	switch s {
	case "openai":
		return APIOpenAI
	case "anthropic":
		return APIAnthropic
	}
	return APIJobs
}

// Outcome is the outcome label: how a request's answer was decided.
type Outcome uint8

// Outcomes (intent's four, then the answers that attached to no execution).
const (
	Created  Outcome = iota // a new execution of its own
	Joined                  // followed a live execution of the same intent
	Replayed                // answered from the stored outcome
	Bypassed                // deduplication off: an execution of its own
	Conflict                // 422: the key was used with another request
	InUse                   // 409: a joined copy waited its max_wait, the execution still runs
	Rejected                // refused before admission (a 4xx, or a 5xx when the store was unavailable)
	Degraded                // answered with the route's degraded answer (no backend was healthy)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"created", "joined", "replayed", "bypassed", "conflict", "in_use", "rejected", "degraded"}

// String is the outcome's label value.
func (o Outcome) String() string { return outcomeNames[min(o, Degraded)] }

// OutcomeOf is the Outcome of one of intent's outcome names; ok is false for anything else.
func OutcomeOf(s string) (o Outcome, ok bool) {
	for i, n := range outcomeNames[:Bypassed+1] {
		if n == s {
			return Outcome(i), true
		}
	}
	return Rejected, false
}

// codeClass is the code label: 2xx, 4xx or 5xx (1xx/3xx do not answer a generation).
func codeClass(status int) int {
	switch {
	case status >= 500:
		return 2
	case status >= 400:
		return 1
	}
	return 0
}

var codeNames = []string{"2xx", "4xx", "5xx"}

// Result is the result label of a backend attempt.
type Result uint8

// Attempt results.
const (
	ResultOK        Result = iota // a 2xx answer
	Result4xx                     // a 4xx other than 429
	Result429                     // rate limited
	Result5xx                     // a 5xx
	ResultNotSent                 // provably never reached the backend
	ResultAmbiguous               // written, ended without an answer (it may have run)
	ResultTimeout                 // the attempt's time ran out
	numResults
)

var resultNames = [numResults]string{"ok", "4xx", "429", "5xx", "not_sent", "ambiguous", "timeout"}

// ResultOf is the Result of an HTTP status a backend answered with.
func ResultOf(status int) Result {
	switch {
	case status == http.StatusTooManyRequests:
		return Result429
	case status >= 500:
		return Result5xx
	case status >= 400:
		return Result4xx
	}
	return ResultOK
}

// BreakerState is a circuit breaker's state, as the oncegate_breaker_state gauge says it.
type BreakerState uint8

// Breaker states (the gauge's values).
const (
	BreakerClosed    BreakerState = 0
	BreakerHalfOpen  BreakerState = 1
	BreakerOpen      BreakerState = 2
	numBreakerStates              = 3
)

var breakerStateNames = [numBreakerStates]string{"closed", "half_open", "open"}

// EffectEvent is the event label of oncegate_effects_total: what became of one call of the
// effects API (httpapi's /v1/idempotency/{key}/effects).
type EffectEvent uint8

// Effect events.
const (
	EffectClaimed        EffectEvent = iota // a claim that runs the effect (the first, or after a release or a reconcile)
	EffectReplayed                          // a claim answered with the recorded result
	EffectInProgress                        // a claim refused: another caller holds a live claim
	EffectConflict                          // a claim refused: the effect was claimed with other arguments (422)
	EffectNeedsReconcile                    // a claim refused: the effect's outcome is unknown (its lease lapsed, or reported)
	EffectCompleted                         // a result recorded
	EffectUnknown                           // a holder reported it cannot tell whether the effect ran
	EffectReleased                          // a holder reported the effect surely did not run
	EffectRenewed                           // a holder renewed its claim's lease
	EffectStaleFence                        // a completion or report refused: another claim holds the effect
	numEffectEvents
)

var effectEventNames = [numEffectEvents]string{"claimed", "replayed", "in_progress", "conflict", "needs_reconcile", "completed", "unknown", "released", "renewed", "stale_fence"}

// How an execution was avoided.
const (
	howJoined = iota
	howReplayed
	numHows
)

var howNames = []string{"joined", "replayed"}

// Labels are the configured names that bound the tenant, model and backend labels.
type Labels struct {
	Tenants  []string
	Models   []string
	Backends []string
}

// Buckets of the latency histograms: 22 exponential buckets from 0.5 ms to 600 s (factor
// ≈1.95), so sub-millisecond gateway work (a replay from the cache) and minutes-long
// generations both fall in buckets of useful resolution.
var latencyBuckets = prometheus.ExponentialBucketsRange(0.0005, 600, 22)

// followerBuckets: 1, 2, 4 … 1024 copies of one execution.
var followerBuckets = prometheus.ExponentialBuckets(1, 2, 11)

// Metrics is one process's metrics. The zero value is not usable; a nil *Metrics is (it does
// nothing).
type Metrics struct {
	reg *prometheus.Registry

	tenants  names
	models   names
	backends names

	requests        cells[prometheus.Counter]  // route, api, outcome, code
	duration        cells[prometheus.Observer] // api, outcome
	ttft            cells[prometheus.Observer] // api, outcome
	added           cells[prometheus.Observer] // api
	attempts        cells[prometheus.Counter]  // backend, result
	executions      cells[prometheus.Counter]  // backend, result (completed, failed)
	retries         cells[prometheus.Counter]  // backend
	budgetRefusals  cells[prometheus.Counter]  // backend
	breakerState    cells[prometheus.Gauge]    // backend
	breakerMoves    cells[prometheus.Counter]  // backend, to
	avoided         cells[prometheus.Counter]  // tenant, model, how
	saved           cells[prometheus.Counter]  // tenant, model
	spend           cells[prometheus.Counter]  // tenant, model
	reversals       cells[prometheus.Counter]  // tenant
	ledgerForwards  cells[prometheus.Counter]  // outcome (ledgerForwardOutcomes)
	tenantRefusals  cells[prometheus.Counter]  // tenant
	effects         cells[prometheus.Counter]  // event
	duplicates      prometheus.Counter
	takeovers       prometheus.Counter
	fenced          prometheus.Counter
	renewalsFailed  prometheus.Counter
	redelivered     prometheus.Counter
	followers       prometheus.Histogram
	replayCacheHits prometheus.Counter
	jsErrors        prometheus.Counter
	// genai are the OpenTelemetry GenAI client histograms (genai.go).
	genai genAIMetrics

	backlog   atomic.Pointer[func(context.Context) (uint64, error)]
	connected atomic.Pointer[func() bool]
	// partitions reads what the readiness checks found of each partition (SetPartitions).
	partitions atomic.Pointer[func() []partition.State]
}

// New builds the metrics of one process, bounded by l, in a registry of their own (with the
// Go runtime and process collectors).
func New(l Labels) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(),
		tenants: newNames(append([]string{Anonymous}, l.Tenants...), Anonymous), models: newNames(l.Models, Other),
		backends: newNames(l.Backends, Other)}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	routes, apis, outcomes, results := routeNames[:], apiNames[:], outcomeNames[:], resultNames[:]
	m.requests = counterVec(m.reg, "requests_total", "Generation and jobs requests, counted once when the answer is decided.",
		[]string{"route", "api", "outcome", "code"}, routes, apis, outcomes, codeNames)
	m.duration = histogramVec(m.reg, "request_duration_seconds", "Whole request, to the last byte of the answer.", latencyBuckets,
		[]string{"api", "outcome"}, apis, outcomes)
	m.ttft = histogramVec(m.reg, "time_to_first_token_seconds", "Streams: from the request to the first content byte.", latencyBuckets,
		[]string{"api", "outcome"}, apis, outcomes)
	m.added = histogramVec(m.reg, "added_latency_seconds",
		"Created requests: the API node's own time (admission, and from the first chunk to the answer), excluding the queue, the worker and the backend.",
		latencyBuckets, []string{"api"}, apis)
	bk := m.backends.values
	m.attempts = counterVec(m.reg, "backend_attempts_total", "Backend attempts a worker sent, by result.", []string{"backend", "result"}, bk, results)
	m.executions = counterVec(m.reg, "backend_executions_total", "Executions a worker finished, by the backend that answered.",
		[]string{"backend", "result"}, bk, []string{"completed", "failed"})
	m.retries = counterVec(m.reg, "backend_retries_total", "Backend attempts after an execution's first.", []string{"backend"}, bk)
	m.budgetRefusals = counterVec(m.reg, "retry_budget_refusals_total", "Retries the retry budget refused.", []string{"backend"}, bk)
	m.breakerState = gaugeVec(m.reg, "breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", []string{"backend"}, bk)
	m.breakerMoves = counterVec(m.reg, "breaker_transitions_total", "Circuit breaker state changes, by the state entered.",
		[]string{"backend", "to"}, bk, breakerStateNames[:])
	tn, md := m.tenants.values, m.models.values
	m.avoided = counterVec(m.reg, "executions_avoided_total", "Copies that reached no backend: joined a live execution or replayed a stored one.",
		[]string{"tenant", "model", "how"}, tn, md, howNames)
	m.saved = counterVec(m.reg, "saved_micros_total", "Money the avoided executions saved, in ledger micro-units (priced from the avoided execution's usage).",
		[]string{"tenant", "model"}, tn, md)
	m.spend = counterVec(m.reg, "spend_micros_total", "Charges appended to the ledger, in micro-units.", []string{"tenant", "model"}, tn, md)
	m.reversals = counterVec(m.reg, "ledger_reversals_total", "Reversal entries appended to the ledger.", []string{"tenant"}, tn)
	m.ledgerForwards = counterVec(m.reg, "ledger_forwards_total", "Ledger appends this node sent to the node that leads the ledger's stream, by outcome: appended there, or appended by this node after no valid answer (fallback).",
		[]string{"outcome"}, ledgerForwardOutcomes)
	m.tenantRefusals = counterVec(m.reg, "budget_refusals_total", "New intents refused by the tenant's budget.", []string{"tenant"}, tn)
	m.effects = counterVec(m.reg, "effects_total", "Calls of the effects API, by what became of them (claims, replays, conflicts, unknown outcomes...).",
		[]string{"event"}, effectEventNames[:])
	m.duplicates = counter(m.reg, "duplicate_executions_total", "Intents the reconciler found charged more than once (should stay 0).")
	m.takeovers = counter(m.reg, "takeovers_total", "Records taken over after a lapsed lease.")
	m.fenced = counter(m.reg, "fenced_writes_total", "Writes refused because another epoch owns the record.")
	m.renewalsFailed = counter(m.reg, "lease_renewals_failed_total", "Lease renewals that failed.")
	m.redelivered = counter(m.reg, "jobs_redelivered_total", "JOBS messages delivered more than once.")
	m.followers = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "followers_per_execution",
		Help: "Copies that followed one live execution on this node, observed when it ends.", Buckets: followerBuckets})
	m.reg.MustRegister(m.followers)
	m.replayCacheHits = counter(m.reg, "replay_cache_hits_total", "Replays answered from the node's replay cache.")
	m.jsErrors = counter(m.reg, "jetstream_api_errors_total", "JetStream API errors the process saw (API responses carrying an error).")
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "nats_connected",
		Help: "1 when every NATS connection of the process is connected, else 0."}, m.natsConnected))
	m.reg.MustRegister(&backlogCollector{m: m, desc: prometheus.NewDesc(namespace+"_jobs_backlog",
		"Queued JOBS messages not yet acked (pending and in flight), read from the consumer at scrape time; a job the admitting node runs at once in a free worker slot (held) is never queued.", nil, nil)})
	m.reg.MustRegister(&partitionCollector{m: m,
		admits: prometheus.NewDesc(namespace+"_partition_admits",
			"1 while the partition's record and job streams each have a leader with a quorum, as this node's last readiness check found them; only with nats.partitions above 1.", []string{"partition"}, nil),
		leads: prometheus.NewDesc(namespace+"_partition_leads",
			"How many of the partition's streams this node's embedded NATS server leads; only with nats.partitions above 1.", []string{"partition"}, nil)})
	m.registerGenAI()
	m.zeroes()
	return m
}

// maxZeroedTenantModels bounds the tenant × model series created at 0 up front.
const maxZeroedTenantModels = 256

// zeroes creates the bounded counter series at 0 before their first event, so a rate() or an
// alert sees the first increment, and every family is in the scrape from the start (the
// dashboard's queries name them): the requests of the three generation routes with their
// API, every backend's and every tenant's counters, and the tenant × model ones while there
// are few (past maxZeroedTenantModels they appear on first use). Histograms appear on first
// use: a zero histogram costs a series per bucket.
func (m *Metrics) zeroes() {
	for _, ra := range [][2]int{{int(RouteChat), int(APIOpenAI)}, {int(RouteMessages), int(APIAnthropic)}, {int(RouteJobs), int(APIJobs)}, {int(RouteResponses), int(APIOpenAI)}} {
		for o := range int(numOutcomes) {
			for code := range codeNames {
				m.requests.at(ra[0], ra[1], o, code)
			}
		}
	}
	for b := range m.backends.values {
		for r := range int(numResults) {
			m.attempts.at(b, r)
		}
		for r := range 2 {
			m.executions.at(b, r)
		}
		for to := range int(numBreakerStates) {
			m.breakerMoves.at(b, to)
		}
		m.retries.at(b)
		m.budgetRefusals.at(b)
	}
	for e := range int(numEffectEvents) {
		m.effects.at(e)
	}
	for t := range m.tenants.values {
		m.reversals.at(t)
		m.tenantRefusals.at(t)
	}
	if len(m.tenants.values)*len(m.models.values) > maxZeroedTenantModels {
		return
	}
	for t := range m.tenants.values {
		for md := range m.models.values {
			m.avoided.at(t, md, howJoined)
			m.avoided.at(t, md, howReplayed)
			m.saved.at(t, md)
			m.spend.at(t, md)
		}
	}
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the process's registry (for tests and for collectors of other rooms).
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Request counts one request whose answer was decided (status is the HTTP status) and
// observes its duration; ttft > 0 is observed for a stream.
func (m *Metrics) Request(route Route, api API, o Outcome, status int, dur, ttft time.Duration) {
	if m == nil {
		return
	}
	m.requests.at(int(route), int(api), int(o), codeClass(status)).Inc()
	m.duration.at(int(api), int(o)).Observe(dur.Seconds())
	if ttft > 0 {
		m.ttft.at(int(api), int(o)).Observe(ttft.Seconds())
	}
}

// AddedLatency observes a created request's own time on the API node.
func (m *Metrics) AddedLatency(api API, d time.Duration) {
	if m == nil {
		return
	}
	m.added.at(int(api)).Observe(d.Seconds())
}

// Attempt counts one backend attempt; retry says it was not the execution's first on it.
func (m *Metrics) Attempt(backend string, r Result, retry bool) {
	if m == nil {
		return
	}
	b := m.backends.index(backend)
	m.attempts.at(b, int(r)).Inc()
	if retry {
		m.retries.at(b).Inc()
	}
}

// Execution counts an execution a worker finished (backend is the one that answered, "" when
// none did).
func (m *Metrics) Execution(backend string, completed bool) {
	if m == nil {
		return
	}
	r := 1
	if completed {
		r = 0
	}
	m.executions.at(m.backends.index(backend), r).Inc()
}

// RetryBudgetRefused counts a retry the retry budget refused.
func (m *Metrics) RetryBudgetRefused(backend string) {
	if m == nil {
		return
	}
	m.budgetRefusals.at(m.backends.index(backend)).Inc()
}

// Breaker records a breaker's state change (and, for the first report, its initial state
// with changed=false: the gauge is set, no transition counted).
func (m *Metrics) Breaker(backend string, to BreakerState, changed bool) {
	if m == nil || to >= numBreakerStates {
		return
	}
	b := m.backends.index(backend)
	m.breakerState.at(b).Set(float64(to))
	if changed {
		m.breakerMoves.at(b, int(to)).Inc()
	}
}

// Avoided counts a copy that reached no backend (joined, else replayed) and the money it
// saved in micro-units.
func (m *Metrics) Avoided(tenant, model string, joined bool, savedMicros int64) {
	if m == nil {
		return
	}
	t, md := m.tenants.index(tenant), m.models.index(model)
	how := howReplayed
	if joined {
		how = howJoined
	}
	m.avoided.at(t, md, how).Inc()
	if savedMicros > 0 {
		m.saved.at(t, md).Add(float64(savedMicros))
	}
}

// Spend counts a charge appended to the ledger.
func (m *Metrics) Spend(tenant, model string, micros int64) {
	if m == nil || micros < 0 {
		return
	}
	m.spend.at(m.tenants.index(tenant), m.models.index(model)).Add(float64(micros))
}

// Reversal counts a reversal entry appended to the ledger.
func (m *Metrics) Reversal(tenant string) {
	if m == nil {
		return
	}
	m.reversals.at(m.tenants.index(tenant)).Inc()
}

// ledgerForwardOutcomes label ledger_forwards_total: the appender stored the entry, or the
// sender appended it itself (no appender, no answer in time, a refusal).
var ledgerForwardOutcomes = []string{"appended", "fallback"}

// LedgerForward counts a ledger append sent to the stream leader's node: appended there, or
// not (the sender appends it itself).
func (m *Metrics) LedgerForward(appended bool) {
	if m == nil {
		return
	}
	outcome := 1
	if appended {
		outcome = 0
	}
	m.ledgerForwards.at(outcome).Inc()
}

// DuplicateExecutions counts intents the reconciler found charged more than once.
func (m *Metrics) DuplicateExecutions(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.duplicates.Add(float64(n))
}

// BudgetRefused counts a new intent the tenant's budget refused.
func (m *Metrics) BudgetRefused(tenant string) {
	if m == nil {
		return
	}
	m.tenantRefusals.at(m.tenants.index(tenant)).Inc()
}

// Effect counts one call of the effects API by what became of it.
func (m *Metrics) Effect(e EffectEvent) {
	if m != nil && e < numEffectEvents {
		m.effects.at(int(e)).Inc()
	}
}

// Takeover counts a record taken over after its lease lapsed.
func (m *Metrics) Takeover() {
	if m != nil {
		m.takeovers.Inc()
	}
}

// FencedWrite counts a write refused because another epoch owns the record.
func (m *Metrics) FencedWrite() {
	if m != nil {
		m.fenced.Inc()
	}
}

// LeaseRenewalFailed counts a failed lease renewal.
func (m *Metrics) LeaseRenewalFailed() {
	if m != nil {
		m.renewalsFailed.Inc()
	}
}

// Redelivered counts a JOBS message delivered more than once.
func (m *Metrics) Redelivered() {
	if m != nil {
		m.redelivered.Inc()
	}
}

// Followers observes how many copies followed one live execution on this node.
func (m *Metrics) Followers(n int) {
	if m != nil && n > 0 {
		m.followers.Observe(float64(n))
	}
}

// ReplayCacheHit counts a replay answered from the node's cache.
func (m *Metrics) ReplayCacheHit() {
	if m != nil {
		m.replayCacheHits.Inc()
	}
}

// JetStreamAPIError counts a JetStream API error.
func (m *Metrics) JetStreamAPIError() {
	if m != nil {
		m.jsErrors.Inc()
	}
}

// SetBacklog sets where oncegate_jobs_backlog is read from at scrape time (the JOBS
// consumer's pending plus ack-pending messages). Until it is set, or while it fails, the
// gauge is absent from the scrape: an absent series says "unknown", a 0 would say "empty".
func (m *Metrics) SetBacklog(read func(context.Context) (uint64, error)) {
	if m != nil {
		m.backlog.Store(&read)
	}
}

// SetConnected sets where oncegate_nats_connected is read from at scrape time.
func (m *Metrics) SetConnected(connected func() bool) {
	if m != nil {
		m.connected.Store(&connected)
	}
}

func (m *Metrics) natsConnected() float64 {
	if f := m.connected.Load(); f != nil && (*f)() {
		return 1
	}
	return 0
}

// SetPartitions sets where oncegate_partition_admits and oncegate_partition_leads are read
// from at scrape time (a partitioned store's readiness checks).
func (m *Metrics) SetPartitions(read func() []partition.State) {
	if m != nil {
		m.partitions.Store(&read)
	}
}

// partitionCollector reports each partition of a partitioned store (none with one).
type partitionCollector struct {
	m             *Metrics
	admits, leads *prometheus.Desc
}

func (c *partitionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.admits; ch <- c.leads }

func (c *partitionCollector) Collect(ch chan<- prometheus.Metric) {
	read := c.m.partitions.Load()
	if read == nil {
		return
	}
	parts := (*read)()
	if len(parts) < 2 {
		return
	}
	for _, p := range parts {
		label := strconv.Itoa(int(p.Partition))
		admits := 0.0
		if p.Admits {
			admits = 1
		}
		ch <- prometheus.MustNewConstMetric(c.admits, prometheus.GaugeValue, admits, label)
		ch <- prometheus.MustNewConstMetric(c.leads, prometheus.GaugeValue, float64(len(p.Leads)), label)
	}
}

// backlogTimeout bounds the JetStream request a scrape makes for the backlog: a scrape must
// answer even while NATS does not.
const backlogTimeout = 2 * time.Second

// backlogCollector reads the JOBS backlog at scrape time.
type backlogCollector struct {
	m    *Metrics
	desc *prometheus.Desc
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	read := c.m.backlog.Load()
	if read == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	n, err := (*read)(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n))
}

// Value is the current value of the counter or gauge name{labels} (labels must name every
// label of the series; 0 when there is no such series): for tests and tools that read one
// number without a scrape.
func (m *Metrics) Value(name string, labels map[string]string) float64 {
	if m == nil {
		return 0
	}
	fams, err := m.reg.Gather()
	if err != nil {
		return 0
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			if len(s.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range s.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			if s.Gauge != nil {
				return s.Gauge.GetValue()
			}
			return s.GetCounter().GetValue()
		}
	}
	return 0
}
