package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario names.
const (
	ScenarioOverhead   = "overhead"
	ScenarioDuplicates = "duplicates"
	ScenarioRetryStorm = "retry-storm"
	ScenarioFanout     = "fanout"
	ScenarioReplay     = "replay"
)

// Scenarios lists the scenario names in the order the usage text shows them.
func Scenarios() []string {
	return []string{ScenarioOverhead, ScenarioDuplicates, ScenarioRetryStorm, ScenarioFanout, ScenarioReplay}
}

// Limits of a run without Config.AllowLong.
const (
	MaxDuration    = 10 * time.Minute
	MaxRequestsCap = 10_000_000
)

// MaxPromptBytes bounds --prompt-bytes.
const MaxPromptBytes = 1 << 20

// ErrConfig is returned by [Config.Validate] (and [Run]) for an invalid configuration.
var ErrConfig = errors.New("bench: invalid configuration")

// ErrSetup is returned by [Run] when a scenario's preparation (the replay pool) failed.
var ErrSetup = errors.New("bench: setup failed")

// ErrCutShort is returned by [Run], with a partial report, when the run was interrupted or
// ran past its time budget.
var ErrCutShort = errors.New("bench: run cut short")

// MockKnobs are the per-request knobs of oncegate's mock ("mock" in the request body); nil
// fields are not sent. Delays are sent in whole milliseconds.
type MockKnobs struct {
	Tokens     *int
	InterToken *time.Duration
	TTFT       *time.Duration
	Fault      string // e.g. "error_503", "rate_limit"; "" sends none
}

// Config is one run of the load tool. Start from [DefaultConfig].
type Config struct {
	URL        string // target base URL; requests go to <URL>/v1/chat/completions
	CompareURL string // optional second target, measured in interleaved slices
	Scenario   string

	Concurrency int           // closed loop: workers; open loop: the in-flight cap
	Duration    time.Duration // measured time per target
	Warmup      time.Duration // per target, not measured
	Rate        float64       // intents per second per target; > 0 selects the open loop
	Slice       time.Duration // compare: length of one interleaved slice
	Stream      bool
	MaxRequests int64         // hard cap on requests per target (warm-up included)
	Timeout     time.Duration // per request

	// Header is sent with every request to the targets (URL and CompareURL), never to
	// MockStatsURL: an API key, a tenant's or a provider's headers. APIKey, when set, is sent
	// as "Authorization: Bearer <APIKey>" to both targets.
	Header http.Header
	APIKey string

	Model string
	// CompareModel is the model named in requests to CompareURL; empty: Model. A router that
	// wants a provider prefix ("openai/oncegate-mock") compared with the backend it fronts.
	CompareModel string
	Mock         MockKnobs
	// PromptBytes pads each intent's prompt to at least this many bytes (0: a one-line
	// prompt), to measure how the cost grows with the request's size.
	PromptBytes int

	Copies        int           // duplicates: copies per intent
	Keys          *bool         // send Idempotency-Key; nil: the scenario's default
	ClientTimeout time.Duration // retry-storm: an attempt fails after this long without a byte
	Retries       int           // retry-storm: retries per call
	Subscribers   int           // fanout: late subscribers per stream
	KeysPool      int           // replay: completed intents requested again

	// MockStatsURL is the base URL of an oncegate mock whose GET /stats counts backend
	// executions. Executions, when set, is used instead.
	MockStatsURL string
	Executions   func(ctx context.Context) (int64, error)

	AllowRemote bool // allow non-loopback targets
	AllowLong   bool // allow Duration > MaxDuration and MaxRequests > MaxRequestsCap
}

// DefaultConfig returns the defaults of `oncegate bench`.
func DefaultConfig() Config {
	return Config{
		URL:           "http://127.0.0.1:8080",
		Scenario:      ScenarioOverhead,
		Concurrency:   16,
		Duration:      10 * time.Second,
		Warmup:        time.Second,
		Slice:         time.Second,
		MaxRequests:   1_000_000,
		Timeout:       30 * time.Second,
		Model:         "oncegate-mock",
		Copies:        5,
		ClientTimeout: time.Second,
		Retries:       2,
		Subscribers:   10,
		KeysPool:      100,
	}
}

// Validate reports every problem of c at once, wrapped in ErrConfig.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if c.URL == "" {
		bad("--url is required")
	}
	known := false
	for _, s := range Scenarios() {
		known = known || s == c.Scenario
	}
	if !known {
		bad("--scenario %q: want one of %s", c.Scenario, strings.Join(Scenarios(), ", "))
	}
	if c.Concurrency < 1 || c.Concurrency > 10_000 {
		bad("--concurrency %d: want 1..10000", c.Concurrency)
	}
	if c.Duration <= 0 {
		bad("--duration %s: want > 0", c.Duration)
	} else if c.Duration > MaxDuration && !c.AllowLong {
		bad("--duration %s is longer than %s: pass --allow-long", c.Duration, MaxDuration)
	}
	if c.Warmup < 0 || (c.Warmup > MaxDuration && !c.AllowLong) {
		bad("--warmup %s: want 0..%s", c.Warmup, MaxDuration)
	}
	if c.Rate < 0 || c.Rate > 1e6 {
		bad("--rate %g: want 0 (closed loop) or up to 1e6 per second", c.Rate)
	}
	if c.CompareURL != "" && c.Slice < 10*time.Millisecond {
		bad("--slice %s: want >= 10ms", c.Slice)
	}
	if c.MaxRequests < 1 {
		bad("--max-requests %d: want >= 1", c.MaxRequests)
	} else if c.MaxRequests > MaxRequestsCap && !c.AllowLong {
		bad("--max-requests %d is above %d: pass --allow-long", c.MaxRequests, MaxRequestsCap)
	}
	if c.Timeout <= 0 || c.Timeout > MaxDuration {
		bad("--timeout %s: want > 0 and <= %s", c.Timeout, MaxDuration)
	}
	if c.Model == "" {
		bad("--model is required")
	}
	if c.CompareModel != "" && c.CompareURL == "" {
		bad("--compare-model needs --compare")
	}
	c.validateHeaders(bad)
	if c.PromptBytes < 0 || c.PromptBytes > MaxPromptBytes {
		bad("--prompt-bytes %d: want 0..%d", c.PromptBytes, MaxPromptBytes)
	}
	if c.Mock.Tokens != nil && (*c.Mock.Tokens < 0 || *c.Mock.Tokens > 1<<20) {
		bad("--mock-tokens %d: want 0..%d", *c.Mock.Tokens, 1<<20)
	}
	for name, d := range map[string]*time.Duration{"--mock-itl": c.Mock.InterToken, "--mock-ttft": c.Mock.TTFT} {
		if d != nil && (*d < 0 || *d > time.Hour) {
			bad("%s %s: want 0..1h", name, *d)
		}
	}
	switch c.Scenario {
	case ScenarioDuplicates:
		if c.Copies < 1 || c.Copies > 1000 {
			bad("--copies %d: want 1..1000", c.Copies)
		}
	case ScenarioRetryStorm:
		if c.ClientTimeout <= 0 || c.ClientTimeout > c.Timeout {
			bad("--client-timeout %s: want > 0 and <= --timeout (%s)", c.ClientTimeout, c.Timeout)
		}
		if c.Retries < 0 || c.Retries > 10 {
			bad("--retries %d: want 0..10", c.Retries)
		}
	case ScenarioFanout:
		if c.Subscribers < 1 || c.Subscribers > 10_000 {
			bad("--subscribers %d: want 1..10000", c.Subscribers)
		}
	case ScenarioReplay:
		if c.KeysPool < 1 || c.KeysPool > 1_000_000 {
			bad("--keys-pool %d: want 1..1000000", c.KeysPool)
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrConfig, strings.Join(probs, "; "))
	}
	return nil
}

// target is one URL under load and what was measured on it.
type target struct {
	label   string // "A" or "B"
	base    string // as given
	chatURL string
	model   string       // named in its requests' bodies
	seq     atomic.Int64 // next intent number
	sent    atomic.Int64 // requests reserved against MaxRequests
	max     int64
	pool    []pooled // replay
	tally   *tally   // measured slices only
}

// reserve claims n requests against the cap; false when they would exceed it.
func (t *target) reserve(n int64) bool {
	if t.sent.Add(n) > t.max {
		t.sent.Add(-n)
		return false
	}
	return true
}

func (t *target) exhausted() bool { return t.sent.Load() >= t.max }

// runner is one run: the configuration, the HTTP client, the scenario, the targets.
type runner struct {
	cfg     Config
	client  *http.Client
	runID   string
	scen    scenario
	targets []*target
	count   func(context.Context) (int64, error)
	header  http.Header // on every request to a target (read-only during the run)
	filler  string      // Words of PromptBytes, made once: every prompt is padded with its start
}

// Run executes cfg: checks the targets, prepares the scenario on each target, warms each up,
// then measures — one target for Duration, or two in interleaved slices (A, B, A, B, …, each
// Slice long, until each had Duration) so that noise hits both. Between slices every
// in-flight request is waited for, so a slice's requests (and the backend executions counted
// around it) belong to one target. The run is bounded: every request has Timeout, each target
// at most MaxRequests requests, and the whole run a time budget after which it is cut short.
// On ErrCutShort the partial report is returned with the error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	urls := []string{cfg.URL}
	if cfg.CompareURL != "" {
		urls = append(urls, cfg.CompareURL)
	}
	checks := urls
	if cfg.MockStatsURL != "" && cfg.Executions == nil {
		checks = append(checks, cfg.MockStatsURL)
	}
	for _, u := range checks {
		if err := CheckTarget(ctx, u, cfg.AllowRemote, nil); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	scen := newScenario(&cfg)
	client := newClient(cfg.Concurrency*scen.width(), cfg.AllowRemote)
	defer client.CloseIdleConnections()

	var id [6]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	r := &runner{cfg: cfg, client: client, runID: hex.EncodeToString(id[:]), scen: scen, count: cfg.Executions,
		header: cfg.requestHeader(), filler: Words(cfg.PromptBytes, 1)}
	if r.count == nil && cfg.MockStatsURL != "" {
		r.count = statsCounter(client, cfg.MockStatsURL)
	}
	models := []string{cfg.Model, cmp.Or(cfg.CompareModel, cfg.Model)}
	for i, u := range urls {
		base := strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/v1")
		r.targets = append(r.targets, &target{label: string(rune('A' + i)), base: u,
			chatURL: base + "/v1/chat/completions", model: models[i], max: cfg.MaxRequests, tally: newTally()})
	}

	ctx, cancel := context.WithTimeoutCause(ctx, r.budget(), fmt.Errorf("%w: time budget %s exceeded", ErrCutShort, r.budget()))
	defer cancel()
	start := time.Now()
	for _, t := range r.targets {
		if err := scen.prepare(ctx, r, t); err != nil {
			return nil, fmt.Errorf("%w: %s on %s: %w", ErrSetup, cfg.Scenario, t.base, err)
		}
	}
	if cfg.Warmup > 0 {
		for _, t := range r.targets {
			r.slice(ctx, t, cfg.Warmup, newTally(), false)
		}
	}
	if len(r.targets) == 1 {
		r.slice(ctx, r.targets[0], cfg.Duration, r.targets[0].tally, true)
	} else {
		for left := cfg.Duration; left > 0 && ctx.Err() == nil; left -= cfg.Slice {
			for _, t := range r.targets {
				r.slice(ctx, t, min(cfg.Slice, left), t.tally, true)
			}
		}
	}
	rep := r.report(time.Since(start))
	if ctx.Err() != nil {
		cause := context.Cause(ctx)
		if !errors.Is(cause, ErrCutShort) {
			cause = fmt.Errorf("%w: %w", ErrCutShort, cause)
		}
		rep.CutShort = cause.Error()
		return rep, cause
	}
	return rep, nil
}

// budget is the longest a run may take: setup, warm-up and measured time of every target,
// plus room for the last intents to finish.
func (r *runner) budget() time.Duration {
	n := time.Duration(len(r.targets))
	if n == 0 {
		n = 2
	}
	op := r.scen.opBound()
	setup := time.Duration(0)
	if r.cfg.Scenario == ScenarioReplay {
		setup = time.Duration((r.cfg.KeysPool+r.cfg.Concurrency-1)/r.cfg.Concurrency) * r.cfg.Timeout
	}
	return n*(setup+r.cfg.Warmup+r.cfg.Duration) + 2*op + 30*time.Second
}

// slice loads t for d and waits for every intent it started. With measured, the elapsed
// time and the backend executions counted around the slice go to tl.
func (r *runner) slice(ctx context.Context, t *target, d time.Duration, tl *tally, measured bool) {
	if ctx.Err() != nil || t.exhausted() {
		return
	}
	var before int64
	var countErr error
	if measured && r.count != nil {
		before, countErr = r.count(ctx)
	}
	start := time.Now()
	if r.cfg.Rate > 0 {
		r.openLoop(ctx, t, start.Add(d), tl)
	} else {
		r.closedLoop(ctx, t, start.Add(d), tl)
	}
	if !measured {
		return
	}
	tl.addElapsed(time.Since(start))
	if r.count == nil {
		return
	}
	if countErr != nil {
		tl.addExecutions(0, countErr)
		return
	}
	after, err := r.count(context.WithoutCancel(ctx))
	tl.addExecutions(after-before, err)
}

// closedLoop runs Concurrency workers, each starting its next intent as soon as the last one
// finished, until end, the request cap or ctx.
func (r *runner) closedLoop(ctx context.Context, t *target, end time.Time, tl *tally) {
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				if !r.scen.op(ctx, r, t, t.seq.Add(1)-1, tl) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// openLoop starts intents on a fixed schedule (Rate per second) until end, whatever the
// latency; at most Concurrency are in flight, an arrival that finds none free is counted as
// skipped, not queued (queueing would hide the target's latency).
func (r *runner) openLoop(ctx context.Context, t *target, end time.Time, tl *tally) {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, r.cfg.Concurrency)
	var stop atomic.Bool
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	start := time.Now()
	for i := int64(0); !stop.Load() && !t.exhausted(); i++ {
		at := start.Add(time.Duration(float64(i) * float64(time.Second) / r.cfg.Rate))
		if !at.Before(end) {
			return
		}
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			tl.addSkipped()
			continue
		}
		seq := t.seq.Add(1) - 1
		wg.Go(func() {
			defer func() { <-slots }()
			if !r.scen.op(ctx, r, t, seq, tl) {
				stop.Store(true)
			}
		})
	}
}
