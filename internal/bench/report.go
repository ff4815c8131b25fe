package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run: one Result per target and, with two targets, their
// comparison. It is what --json prints.
type Report struct {
	RunID        string  `json:"run_id"`
	Scenario     string  `json:"scenario"`
	Loop         string  `json:"loop"` // "closed" or "open"
	Concurrency  int     `json:"concurrency"`
	Rate         float64 `json:"rate_per_s,omitempty"`
	Stream       bool    `json:"stream"`
	Model        string  `json:"model"`
	CompareModel string  `json:"compare_model,omitempty"` // the model named to target B when it differs
	Keys         bool    `json:"keys"`                    // an Idempotency-Key was sent
	DurationS    float64 `json:"duration_s"`
	WarmupS      float64 `json:"warmup_s"`
	SliceS       float64 `json:"slice_s,omitempty"`
	WallS        float64 `json:"wall_s"`
	MaxRequests  int64   `json:"max_requests"`

	Copies          int     `json:"copies,omitempty"`
	ClientTimeoutMs float64 `json:"client_timeout_ms,omitempty"`
	Retries         int     `json:"retries,omitempty"`
	Subscribers     int     `json:"subscribers,omitempty"`
	KeysPool        int     `json:"keys_pool,omitempty"`

	Targets  []Result    `json:"targets"`
	Compare  *Comparison `json:"compare,omitempty"`
	CutShort string      `json:"cut_short,omitempty"`
}

// Result is what was measured on one target (measured slices only, warm-up excluded).
type Result struct {
	Label    string  `json:"label"` // "A", or "B" for --compare
	URL      string  `json:"url"`
	ElapsedS float64 `json:"elapsed_s"` // measured time, including waiting for the last requests

	Requests       int64             `json:"requests"`
	Successes      int64             `json:"successes"`
	Errors         map[string]int64  `json:"errors"`
	ErrorSamples   map[string]string `json:"error_samples,omitempty"` // the first error of each kind
	RequestsPerSec float64           `json:"requests_per_s"`
	Bytes          int64             `json:"bytes"`

	// Intents are the scenario's units: one request (overhead, replay), K copies
	// (duplicates), one call with its retries (retry-storm), one stream and its subscribers
	// (fanout).
	Intents       int64   `json:"intents"`
	IntentsOK     int64   `json:"intents_ok"`
	IntentsPerSec float64 `json:"intents_per_s"`
	Retries       int64   `json:"retries,omitempty"`
	Skipped       int64   `json:"skipped,omitempty"`   // open loop: arrivals dropped at the in-flight cap
	Divergent     *int64  `json:"divergent,omitempty"` // duplicates: intents whose copies got different bodies

	Latency       Summary  `json:"latency"` // successful requests, start to end of body
	IntentLatency *Summary `json:"intent_latency,omitempty"`
	TTFT          *Summary `json:"ttft,omitempty"` // streams: start to first data line
	TTLT          *Summary `json:"ttlt,omitempty"` // streams: start to data: [DONE]

	// Idempotency counts the gateway's Oncegate-Idempotency answers (created, joined,
	// replayed, bypassed); empty against a plain backend.
	Idempotency map[string]int64 `json:"idempotency,omitempty"`

	// Executions are backend executions counted during the measured slices (--mock-stats).
	Executions     *int64   `json:"executions,omitempty"`
	ExecPerRequest *float64 `json:"executions_per_request,omitempty"`
	ExecPerIntent  *float64 `json:"executions_per_intent,omitempty"`
	ExecError      string   `json:"executions_error,omitempty"`

	Fanout *FanoutResult `json:"fanout,omitempty"`
}

// FanoutResult is the fanout scenario's delivery to late subscribers.
type FanoutResult struct {
	Rounds              int64   `json:"rounds"`
	SubscribersPerRound int     `json:"subscribers_per_round"`
	Subscribers         int64   `json:"subscribers"`
	Complete            int64   `json:"complete"`   // same chunk count and bytes as the first stream, [DONE] included
	Mismatched          int64   `json:"mismatched"` // completed, but with other chunks than the first stream
	ChunksPerStream     int     `json:"chunks_per_stream"`
	Lag                 Summary `json:"lag"`      // every chunk, replayed ones included
	LiveLag             Summary `json:"live_lag"` // chunks the first stream got after the subscriber's headers
	SubscriberBytes     int64   `json:"subscriber_bytes"`
	BytesPerSubscriber  float64 `json:"bytes_per_subscriber"`
}

// Comparison is B against A: ratios B/A of throughput, differences B-A and ratios B/A of
// latency percentiles. A ratio is absent when A's value is zero, a latency comparison when
// either side has no samples.
type Comparison struct {
	RequestsPerSecRatio *float64           `json:"requests_per_s_ratio"`
	IntentsPerSecRatio  *float64           `json:"intents_per_s_ratio"`
	Latency             *LatencyComparison `json:"latency,omitempty"`
	TTFT                *LatencyComparison `json:"ttft,omitempty"`
	TTLT                *LatencyComparison `json:"ttlt,omitempty"`
}

// LatencyComparison compares two Summaries.
type LatencyComparison struct {
	Mean Delta `json:"mean"`
	P50  Delta `json:"p50"`
	P90  Delta `json:"p90"`
	P99  Delta `json:"p99"`
	P999 Delta `json:"p99_9"`
	Max  Delta `json:"max"`
}

// Delta is B-A in milliseconds and B/A.
type Delta struct {
	DiffMs float64  `json:"diff_ms"`
	Ratio  *float64 `json:"ratio,omitempty"`
}

func ratio(b, a float64) *float64 {
	if a == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return nil
	}
	r := math.Round(b/a*10000) / 10000
	return &r
}

func delta(b, a time.Duration) Delta {
	return Delta{DiffMs: ms(b - a), Ratio: ratio(float64(b), float64(a))}
}

func compareSummaries(b, a *Summary) *LatencyComparison {
	if a == nil || b == nil || a.Count == 0 || b.Count == 0 {
		return nil
	}
	return &LatencyComparison{Mean: delta(b.Mean, a.Mean), P50: delta(b.P50, a.P50), P90: delta(b.P90, a.P90),
		P99: delta(b.P99, a.P99), P999: delta(b.P999, a.P999), Max: delta(b.Max, a.Max)}
}

func perSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return math.Round(float64(n)/d.Seconds()*100) / 100
}

func secs(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// report builds the Report from the targets' tallies.
func (r *runner) report(wall time.Duration) *Report {
	c := &r.cfg
	rep := &Report{
		RunID: r.runID, Scenario: c.Scenario, Loop: "closed", Concurrency: c.Concurrency, Stream: c.Stream,
		Model: c.Model, CompareModel: c.CompareModel, Keys: effectiveKeys(c), DurationS: secs(c.Duration), WarmupS: secs(c.Warmup),
		WallS: secs(wall), MaxRequests: c.MaxRequests,
	}
	if c.Rate > 0 {
		rep.Loop, rep.Rate = "open", c.Rate
	}
	if len(r.targets) > 1 {
		rep.SliceS = secs(c.Slice)
	}
	switch c.Scenario {
	case ScenarioDuplicates:
		rep.Copies = c.Copies
	case ScenarioRetryStorm:
		rep.ClientTimeoutMs, rep.Retries = ms(c.ClientTimeout), c.Retries
	case ScenarioFanout:
		rep.Subscribers, rep.Stream = c.Subscribers, true
	case ScenarioReplay:
		rep.KeysPool = c.KeysPool
	}
	for _, t := range r.targets {
		rep.Targets = append(rep.Targets, t.result(c, rep.Stream))
	}
	if len(rep.Targets) == 2 {
		a, b := &rep.Targets[0], &rep.Targets[1]
		rep.Compare = &Comparison{
			RequestsPerSecRatio: ratio(b.RequestsPerSec, a.RequestsPerSec),
			IntentsPerSecRatio:  ratio(b.IntentsPerSec, a.IntentsPerSec),
			Latency:             compareSummaries(&b.Latency, &a.Latency),
			TTFT:                compareSummaries(b.TTFT, a.TTFT),
			TTLT:                compareSummaries(b.TTLT, a.TTLT),
		}
	}
	return rep
}

// effectiveKeys says whether the scenario sends Idempotency-Key: Config.Keys, else every
// scenario but retry-storm (the official SDKs send no key).
func effectiveKeys(c *Config) bool {
	if c.Keys != nil {
		return *c.Keys
	}
	return c.Scenario != ScenarioRetryStorm
}

func (t *target) result(c *Config, stream bool) Result {
	tl := t.tally
	tl.mu.Lock()
	defer tl.mu.Unlock()
	res := Result{
		Label: t.label, URL: t.base, ElapsedS: secs(tl.elapsed),
		Requests: tl.requests, Successes: tl.ok, Errors: map[string]int64{},
		RequestsPerSec: perSec(tl.requests, tl.elapsed), Bytes: tl.bytes,
		Intents: tl.intents, IntentsOK: tl.intentsOK, IntentsPerSec: perSec(tl.intents, tl.elapsed),
		Retries: tl.retries, Skipped: tl.skipped, Latency: tl.lat.Summary(),
	}
	for k, n := range tl.errs {
		res.Errors[string(k)] = n
	}
	if len(tl.errSample) > 0 {
		res.ErrorSamples = map[string]string{}
		for k, s := range tl.errSample {
			res.ErrorSamples[string(k)] = s
		}
	}
	if len(tl.idem) > 0 {
		res.Idempotency = maps.Clone(tl.idem)
	}
	switch c.Scenario {
	case ScenarioDuplicates, ScenarioRetryStorm, ScenarioFanout:
		s := tl.intentLat.Summary()
		res.IntentLatency = &s
	}
	if c.Scenario == ScenarioDuplicates {
		d := tl.divergent
		res.Divergent = &d
	}
	if stream {
		f, l := tl.ttft.Summary(), tl.ttlt.Summary()
		res.TTFT, res.TTLT = &f, &l
	}
	if tl.execErr != nil {
		res.ExecError = tl.execErr.Error()
	} else if c.MockStatsURL != "" || c.Executions != nil {
		n := tl.executions
		res.Executions = &n
		if tl.requests > 0 {
			v := math.Round(float64(n)/float64(tl.requests)*10000) / 10000
			res.ExecPerRequest = &v
		}
		if tl.intents > 0 {
			v := math.Round(float64(n)/float64(tl.intents)*10000) / 10000
			res.ExecPerIntent = &v
		}
	}
	if c.Scenario == ScenarioFanout {
		f := &FanoutResult{
			Rounds: tl.fan.rounds, SubscribersPerRound: c.Subscribers, Subscribers: tl.fan.subscribers,
			Complete: tl.fan.complete, Mismatched: tl.fan.mismatched, ChunksPerStream: tl.fan.chunks,
			Lag: tl.fan.lag.Summary(), LiveLag: tl.fan.liveLag.Summary(), SubscriberBytes: tl.fan.bytes,
		}
		if f.Subscribers > 0 {
			f.BytesPerSubscriber = math.Round(float64(f.SubscriberBytes)/float64(f.Subscribers)*10) / 10
		}
		res.Fanout = f
	}
	return res
}

// WriteJSON writes rep as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("bench: write json: %w", err)
	}
	return nil
}

// WriteTable writes rep as a table for people: one column per target and, with two targets,
// B/A and B-A columns.
func WriteTable(w io.Writer, rep *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "oncegate bench: scenario %s, %s loop, concurrency %d", rep.Scenario, rep.Loop, rep.Concurrency)
	if rep.Loop == "open" {
		fmt.Fprintf(&b, ", rate %g/s", rep.Rate)
	}
	mode := "non-stream"
	if rep.Stream {
		mode = "stream"
	}
	fmt.Fprintf(&b, ", %s, model %s", mode, rep.Model)
	if rep.CompareModel != "" && rep.CompareModel != rep.Model {
		fmt.Fprintf(&b, " (B: %s)", rep.CompareModel)
	}
	fmt.Fprintf(&b, ", keys %t\n", rep.Keys)
	fmt.Fprintf(&b, "duration %gs per target, warm-up %gs, wall %gs, run %s", rep.DurationS, rep.WarmupS, rep.WallS, rep.RunID)
	switch rep.Scenario {
	case ScenarioDuplicates:
		fmt.Fprintf(&b, ", copies %d", rep.Copies)
	case ScenarioRetryStorm:
		fmt.Fprintf(&b, ", client timeout %gms, retries %d", rep.ClientTimeoutMs, rep.Retries)
	case ScenarioFanout:
		fmt.Fprintf(&b, ", subscribers %d", rep.Subscribers)
	case ScenarioReplay:
		fmt.Fprintf(&b, ", keys pool %d", rep.KeysPool)
	}
	b.WriteString("\n")
	for _, t := range rep.Targets {
		fmt.Fprintf(&b, "  %s  %s", t.Label, t.URL)
		if len(rep.Targets) > 1 {
			fmt.Fprintf(&b, "  (interleaved %gs slices)", rep.SliceS)
		}
		b.WriteString("\n")
	}
	if rep.CutShort != "" {
		fmt.Fprintf(&b, "CUT SHORT: %s\n", rep.CutShort)
	}
	b.WriteString("\n")

	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	two := len(rep.Targets) == 2
	row := func(name string, vals []string, extra ...string) {
		cells := append([]string{name}, vals...)
		if two {
			cells = append(cells, extra...)
		}
		for len(cells) < len(rep.Targets)+1+2 && two {
			cells = append(cells, "")
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	head := []string{}
	for _, t := range rep.Targets {
		head = append(head, t.Label)
	}
	row("", head, "B/A", "B-A")
	each := func(f func(*Result) string) []string {
		out := make([]string, len(rep.Targets))
		for i := range rep.Targets {
			out[i] = f(&rep.Targets[i])
		}
		return out
	}
	count := func(name string, f func(*Result) int64) {
		row(name, each(func(r *Result) string { return fmt.Sprint(f(r)) }))
	}
	rate := func(name string, f func(*Result) float64, rt *float64) {
		row(name, each(func(r *Result) string { return fmt.Sprintf("%.1f", f(r)) }), fmtRatio(rt))
	}
	lat := func(name string, get func(*Result) *Summary, cmp *LatencyComparison) {
		if get(&rep.Targets[0]) == nil {
			return
		}
		type part struct {
			n string
			v func(Summary) time.Duration
			d func(*LatencyComparison) Delta
		}
		for _, p := range []part{
			{"p50", func(s Summary) time.Duration { return s.P50 }, func(c *LatencyComparison) Delta { return c.P50 }},
			{"p90", func(s Summary) time.Duration { return s.P90 }, func(c *LatencyComparison) Delta { return c.P90 }},
			{"p99", func(s Summary) time.Duration { return s.P99 }, func(c *LatencyComparison) Delta { return c.P99 }},
			{"p99.9", func(s Summary) time.Duration { return s.P999 }, func(c *LatencyComparison) Delta { return c.P999 }},
			{"max", func(s Summary) time.Duration { return s.Max }, func(c *LatencyComparison) Delta { return c.Max }},
			{"mean", func(s Summary) time.Duration { return s.Mean }, func(c *LatencyComparison) Delta { return c.Mean }},
		} {
			vals := each(func(r *Result) string {
				s := get(r)
				if s == nil || s.Count == 0 {
					return "-"
				}
				return fmtMs(p.v(*s))
			})
			if cmp != nil {
				d := p.d(cmp)
				row(name+" "+p.n, vals, fmtRatio(d.Ratio), fmt.Sprintf("%+.3fms", d.DiffMs))
			} else {
				row(name+" "+p.n, vals)
			}
		}
	}
	var cmp *Comparison
	if two {
		cmp = rep.Compare
	}
	pick := func(f func(*Comparison) *LatencyComparison) *LatencyComparison {
		if cmp == nil {
			return nil
		}
		return f(cmp)
	}

	count("requests", func(r *Result) int64 { return r.Requests })
	count("successes", func(r *Result) int64 { return r.Successes })
	count("errors", func(r *Result) int64 { return r.Requests - r.Successes })
	rate("requests/s", func(r *Result) float64 { return r.RequestsPerSec }, cmpField(cmp, func(c *Comparison) *float64 { return c.RequestsPerSecRatio }))
	if rep.Scenario != ScenarioOverhead && rep.Scenario != ScenarioReplay {
		count("intents", func(r *Result) int64 { return r.Intents })
		count("intents ok", func(r *Result) int64 { return r.IntentsOK })
		rate("intents/s", func(r *Result) float64 { return r.IntentsPerSec }, cmpField(cmp, func(c *Comparison) *float64 { return c.IntentsPerSecRatio }))
	}
	if rep.Scenario == ScenarioRetryStorm {
		count("retries", func(r *Result) int64 { return r.Retries })
	}
	if rep.Loop == "open" {
		count("skipped (in-flight cap)", func(r *Result) int64 { return r.Skipped })
	}
	lat("latency", func(r *Result) *Summary { return &r.Latency }, pick(func(c *Comparison) *LatencyComparison { return c.Latency }))
	lat("ttft", func(r *Result) *Summary { return r.TTFT }, pick(func(c *Comparison) *LatencyComparison { return c.TTFT }))
	lat("ttlt", func(r *Result) *Summary { return r.TTLT }, pick(func(c *Comparison) *LatencyComparison { return c.TTLT }))
	if rep.Targets[0].IntentLatency != nil {
		lat("intent", func(r *Result) *Summary { return r.IntentLatency }, nil)
	}
	if rep.Scenario == ScenarioDuplicates {
		count("divergent intents", func(r *Result) int64 {
			if r.Divergent == nil {
				return 0
			}
			return *r.Divergent
		})
	}
	if rep.Targets[0].Fanout != nil {
		fan := func(f func(*FanoutResult) string) []string {
			return each(func(r *Result) string { return f(r.Fanout) })
		}
		row("fanout rounds", fan(func(f *FanoutResult) string { return fmt.Sprint(f.Rounds) }))
		row("subscribers", fan(func(f *FanoutResult) string { return fmt.Sprint(f.Subscribers) }))
		row("  complete", fan(func(f *FanoutResult) string { return fmt.Sprint(f.Complete) }))
		row("  mismatched", fan(func(f *FanoutResult) string { return fmt.Sprint(f.Mismatched) }))
		row("chunks/stream", fan(func(f *FanoutResult) string { return fmt.Sprint(f.ChunksPerStream) }))
		for _, p := range []struct {
			n string
			s func(*FanoutResult) Summary
		}{{"chunk lag", func(f *FanoutResult) Summary { return f.Lag }}, {"live chunk lag", func(f *FanoutResult) Summary { return f.LiveLag }}} {
			row(p.n+" p50", fan(func(f *FanoutResult) string {
				return fmtSummary(p.s(f), func(s Summary) time.Duration { return s.P50 })
			}))
			row(p.n+" p99", fan(func(f *FanoutResult) string {
				return fmtSummary(p.s(f), func(s Summary) time.Duration { return s.P99 })
			}))
			row(p.n+" max", fan(func(f *FanoutResult) string {
				return fmtSummary(p.s(f), func(s Summary) time.Duration { return s.Max })
			}))
		}
		row("bytes/subscriber", fan(func(f *FanoutResult) string { return fmt.Sprintf("%.0f", f.BytesPerSubscriber) }))
	}
	row("bytes received", each(func(r *Result) string { return fmt.Sprint(r.Bytes) }))
	if slices.ContainsFunc(rep.Targets, func(r Result) bool { return r.Executions != nil || r.ExecError != "" }) {
		row("backend executions", each(func(r *Result) string {
			if r.Executions == nil {
				return "n/a"
			}
			return fmt.Sprint(*r.Executions)
		}))
		row("executions/request", each(func(r *Result) string { return fmtFloat(r.ExecPerRequest) }))
		row("executions/intent", each(func(r *Result) string { return fmtFloat(r.ExecPerIntent) }))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("bench: write table: %w", err)
	}
	for line := range strings.Lines(table.String()) {
		b.WriteString(strings.TrimRight(line, " \n"))
		b.WriteString("\n")
	}

	for _, t := range rep.Targets {
		if len(t.Idempotency) > 0 {
			fmt.Fprintf(&b, "%s oncegate-idempotency: %s\n", t.Label, fmtCounts(t.Idempotency))
		}
	}
	for _, t := range rep.Targets {
		if len(t.Errors) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s errors: %s\n", t.Label, fmtCounts(t.Errors))
		for _, k := range slices.Sorted(maps.Keys(t.ErrorSamples)) {
			fmt.Fprintf(&b, "    %s, first: %s\n", k, t.ErrorSamples[k])
		}
	}
	for _, t := range rep.Targets {
		if t.ExecError != "" {
			fmt.Fprintf(&b, "%s executions not counted: %s\n", t.Label, t.ExecError)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: write table: %w", err)
	}
	return nil
}

func cmpField(c *Comparison, f func(*Comparison) *float64) *float64 {
	if c == nil {
		return nil
	}
	return f(c)
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/1e6) }

func fmtSummary(s Summary, f func(Summary) time.Duration) string {
	if s.Count == 0 {
		return "-"
	}
	return fmtMs(f(s))
}

func fmtRatio(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.2fx", *r)
}

func fmtFloat(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", *v)
}

func fmtCounts(m map[string]int64) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
