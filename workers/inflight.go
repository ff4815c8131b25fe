package workers

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/oncegate/oncegate/dashboard"
)

// latencySamples is how many of a backend's latest answers its median latency is taken over.
const latencySamples = 64

// inflight is what the pool tells the dashboard: the executions it runs now, its latest
// failures and takeovers, and each backend's time to answer. Safe for concurrent use.
type inflight struct {
	mu      sync.Mutex
	running map[*execution]time.Time // → when it started here
	events  []dashboard.Event        // newest last, at most dashboard.MaxEvents
	latency map[string]*ring         // by backend
}

type ring struct {
	v [latencySamples]float64
	n int
}

func (p *Pool) trackStart(ex *execution) {
	p.inflight.mu.Lock()
	if p.inflight.running == nil {
		p.inflight.running = map[*execution]time.Time{}
	}
	p.inflight.running[ex] = p.opts.Now()
	p.inflight.mu.Unlock()
}

func (p *Pool) trackEnd(ex *execution) {
	p.inflight.mu.Lock()
	delete(p.inflight.running, ex)
	p.inflight.mu.Unlock()
}

// noteEvent keeps a failure or a takeover of job (a record key's execution) for the dashboard.
func (p *Pool) noteEvent(kind, jobID, tenant, model, reason string) {
	e := dashboard.Event{At: p.opts.Now().UTC(), Kind: kind, JobID: jobID, Tenant: tenant, Model: model, Node: p.opts.ID, Reason: reason}
	in := &p.inflight
	in.mu.Lock()
	in.events = append(in.events, e)
	if len(in.events) > dashboard.MaxEvents {
		in.events = slices.Delete(in.events, 0, len(in.events)-dashboard.MaxEvents)
	}
	in.mu.Unlock()
}

// noteAnswered records how long backend took to answer the attempt sent at sent.
func (p *Pool) noteAnswered(backend string, sent time.Time) {
	if sent.IsZero() {
		return
	}
	ms := float64(p.opts.Now().Sub(sent).Microseconds()) / 1000
	in := &p.inflight
	in.mu.Lock()
	if in.latency == nil {
		in.latency = map[string]*ring{}
	}
	r := in.latency[backend]
	if r == nil {
		r = &ring{}
		in.latency[backend] = r
	}
	r.v[r.n%latencySamples] = ms
	r.n++
	in.mu.Unlock()
}

// Running lists the executions this pool runs, the oldest first, at most max of total.
func (p *Pool) Running(max int) (rows []dashboard.Execution, total int) {
	in := &p.inflight
	in.mu.Lock()
	type started struct {
		ex *execution
		at time.Time
	}
	all := make([]started, 0, len(in.running))
	for ex, at := range in.running {
		all = append(all, started{ex, at})
	}
	in.mu.Unlock()
	slices.SortFunc(all, func(a, b started) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.ex.job.ID, b.ex.job.ID)) })
	total = len(all)
	for _, s := range all[:min(max, total)] {
		ex := s.ex
		ex.mu.Lock()
		var lease time.Time
		if ex.rec != nil {
			lease = ex.rec.LeaseUntil
		}
		ex.mu.Unlock()
		ex.progress.mu.Lock()
		backend, attempt := ex.progress.cur.Backend, ex.progress.cur.Attempt
		ex.progress.mu.Unlock()
		rows = append(rows, dashboard.Execution{JobID: ex.job.ID, Tenant: ex.job.Tenant, Model: ex.job.Model, Backend: backend,
			Worker: p.opts.ID, Epoch: ex.job.Epoch, Attempt: attempt, Tokens: int(ex.tokens.Load()), Stream: ex.job.Stream,
			Started: s.at.UTC(), LeaseUntil: lease.UTC()})
	}
	return rows, total
}

// Events are the pool's latest failures and takeovers, newest first, at most max.
func (p *Pool) Events(max int) []dashboard.Event {
	in := &p.inflight
	in.mu.Lock()
	defer in.mu.Unlock()
	out := slices.Clone(in.events)
	slices.Reverse(out)
	return out[:min(max, len(out))]
}

// DashboardBackends is Status with each backend's median time to answer.
func (p *Pool) DashboardBackends() []dashboard.Backend {
	st := p.Status()
	out := make([]dashboard.Backend, 0, len(st))
	p.inflight.mu.Lock()
	defer p.inflight.mu.Unlock()
	for _, b := range st {
		d := dashboard.Backend{Name: b.Name, Breaker: b.Breaker, Requests: b.Requests, Failures: b.Failures,
			BudgetRequests: b.Budget.Requests, Retries: b.Budget.Retries, RetriesRefused: b.Budget.Refused}
		if r := p.inflight.latency[b.Name]; r != nil && r.n > 0 {
			v := slices.Clone(r.v[:min(r.n, latencySamples)])
			slices.Sort(v)
			d.LatencyMillis = v[len(v)/2]
		}
		out = append(out, d)
	}
	return out
}

// failureReason says why an execution failed in a few words: its status, the error code of
// its body (never its message, which may quote a backend), and how it ended.
func failureReason(f *failure) string {
	r := strconv.Itoa(f.status)
	var body struct {
		Error struct {
			Code any    `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(f.body, &body) == nil {
		if s, ok := body.Error.Code.(string); ok && s != "" {
			r += " " + s
		} else if body.Error.Type != "" {
			r += " " + body.Error.Type
		}
	}
	switch {
	case f.degraded:
		r += " (degraded answer)"
	case f.ambiguous:
		r += " (ambiguous: may have run)"
	case f.refused:
		r += " (refused: never ran)"
	}
	return r
}
