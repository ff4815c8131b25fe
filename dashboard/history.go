package dashboard

import (
	"encoding/json"
	"sync"
	"time"
)

// The history's shape.
const (
	// HistoryEvery is the time between two samples of the history, so its resolution: one
	// point per 2 s. The counters behind it are posted every PostEvery (1 s) by each process,
	// so a finer point would mostly repeat or double its neighbour; a coarser one would blur a
	// burst of a few seconds, and 450 points already fill a chart's width.
	HistoryEvery = 2 * time.Second
	// HistoryLength is how far back the history goes: the charts' 15 minutes.
	HistoryLength = 15 * time.Minute
	// RateWindow is the window of the rate tiles: the outcomes counted over the last 10 s
	// (five samples) divided by the time between those samples.
	RateWindow = 10 * time.Second
	// RecentPoints is how many of the newest points each view carries, so that a page that
	// missed a view (a slow reader gets the latest only) still gets every point.
	RecentPoints = 5
	// MaxHistoryTenants bounds the tenants whose own history is kept (the first seen). The
	// all-tenants history always is; a tenant past the bound gets no history or rates.
	MaxHistoryTenants = 256
)

// historySamples is the ring's length: HistoryLength/HistoryEvery intervals need one more
// sample than points.
const historySamples = int(HistoryLength/HistoryEvery) + 1

// forgetAfter is how long the history remembers the counters of a process whose snapshot is
// gone: long enough for a snapshot bucket lost with a NATS restart to be posted again.
const forgetAfter = time.Minute

// counters are one scope's cumulative counters: the outcomes in OutcomeNames' order, then the
// added latency's sum (ns) and count.
type counters [NumOutcomes + 2]int64

const (
	addedNanos = NumOutcomes
	addedCount = NumOutcomes + 1
)

func countersOf(c Counts) counters {
	var k counters
	copy(k[:NumOutcomes], c.Outcomes[:])
	k[addedNanos], k[addedCount] = c.AddedNanos, c.AddedCount
	return k
}

// ring is one scope's samples, aligned with history.times.
type ring [historySamples]counters

// Point is one point of a chart: what happened between the previous sample and At.
type Point struct {
	At time.Time `json:"at"`
	// Rates are the outcomes per second over the interval, in OutcomeNames' order.
	Rates [NumOutcomes]float64 `json:"rates"`
	// AddedMillis is the mean added latency of the created requests counted in the interval
	// (AddedCount of them; 0 with none).
	AddedMillis float64 `json:"added_ms"`
	AddedCount  int64   `json:"added_n"`
}

// Rates are the outcomes per second over the last RateWindow of the history.
type Rates struct {
	// Window is the time between the two samples the rates are taken from, in seconds:
	// about RateWindow, less while the history is younger.
	Window float64 `json:"window_s"`
	// PerSecond are the outcomes counted between them divided by Window, in OutcomeNames'
	// order.
	PerSecond [NumOutcomes]float64 `json:"per_s"`
	// AddedMillis is the mean added latency of the created requests counted between them (0
	// with none).
	AddedMillis float64 `json:"added_ms"`
}

// History is what a dashboard gets when it opens: the points of the last HistoryLength (fewer
// while the hub is younger), oldest first, and the rates now.
type History struct {
	Every  float64 `json:"every_s"`
	Length float64 `json:"length_s"`
	Points []Point `json:"points"`
	Rates  *Rates  `json:"rates,omitempty"`
	// Kept is false for a tenant past MaxHistoryTenants (no points, no rates).
	Kept bool `json:"kept"`
}

// procCounts are what the history reads of one process's snapshot.
type procCounts struct {
	At      time.Time `json:"at"`
	Started time.Time `json:"started"`
	Counts  []Counts  `json:"counts"`
}

// procSeen is what the history last accounted of one process.
type procSeen struct {
	byTenant map[string]counters
	last     time.Time
}

// history turns the snapshots' counters, each process's since it started, into the
// cluster's counters since the history began, sampled every HistoryEvery into a ring of
// HistoryLength. A process's counters are accounted as increments from its previous
// snapshot, so a process that stops takes nothing away (its past stays in the history) and one
// that starts adds only what it counts after the history began.
//
// Memory is fixed: a ring of historySamples (451) counters of 56 bytes, about 25 KB, for all
// tenants and for each of at most MaxHistoryTenants tenants (6.5 MB at most), 451 sample
// times (11 KB), and the last counters of each live process per tenant. Safe for concurrent
// use.
type history struct {
	mu sync.Mutex
	// start is when the first sample was taken (zero before).
	start time.Time
	times [historySamples]time.Time
	// n samples are held; head is where the next one goes.
	n, head int
	all     ring
	tenants map[string]*ring
	cumAll  counters
	cum     map[string]*counters
	procs   map[string]*procSeen
}

func newHistory() *history {
	return &history{tenants: map[string]*ring{}, cum: map[string]*counters{}, procs: map[string]*procSeen{}}
}

// sample accounts procs (the latest snapshot of each live process, by bucket key) at now and
// adds a sample.
func (h *history) sample(now time.Time, procs map[string]procCounts) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.start.IsZero() {
		h.start = now
	}
	for key, p := range procs {
		seen := h.procs[key]
		fresh := seen == nil
		if fresh {
			seen = &procSeen{byTenant: map[string]counters{}}
			h.procs[key] = seen
		}
		seen.last = now
		// A process that started before the history began counted its requests before it:
		// its first counters are the base. One started since counted them all since.
		baseline := fresh && p.Started.Before(h.start)
		for _, c := range p.Counts {
			cur := countersOf(c)
			prev, ok := seen.byTenant[c.Tenant]
			if !ok && baseline {
				prev = cur
			}
			seen.byTenant[c.Tenant] = cur
			var inc counters
			any := false
			for i := range cur {
				if d := cur[i] - prev[i]; d > 0 { // a process's counters only grow
					inc[i], any = d, true
				}
			}
			if any {
				h.add(c.Tenant, inc)
			}
		}
	}
	for key, seen := range h.procs {
		if now.Sub(seen.last) > forgetAfter {
			delete(h.procs, key)
		}
	}
	h.times[h.head] = now
	h.all[h.head] = h.cumAll
	for t, r := range h.tenants {
		r[h.head] = *h.cum[t]
	}
	h.head = (h.head + 1) % historySamples
	h.n = min(h.n+1, historySamples)
}

// add counts inc for tenant and all tenants. A tenant's ring is made on its first count (its
// earlier samples are zero, as its counters were), if fewer than MaxHistoryTenants have one.
func (h *history) add(tenant string, inc counters) {
	c := h.cum[tenant]
	if c == nil {
		c = &counters{}
		h.cum[tenant] = c
		if len(h.tenants) < MaxHistoryTenants {
			h.tenants[tenant] = &ring{}
		}
	}
	for i, d := range inc {
		c[i] += d
		h.cumAll[i] += d
	}
}

// series is scope's ring (nil: a tenant past MaxHistoryTenants), or the zero ring of a
// tenant that never counted anything. Called with mu held.
func (h *history) series(scope Scope) *ring {
	if scope.All {
		return &h.all
	}
	if r := h.tenants[scope.Tenant]; r != nil {
		return r
	}
	if h.cum[scope.Tenant] == nil {
		return &ring{}
	}
	return nil
}

// at is the index of the i-th sample held, oldest first. Called with mu held.
func (h *history) at(i int) int {
	return (h.head - h.n + i + 2*historySamples) % historySamples
}

// points are r's newest limit points (every point with limit < 0), oldest first. Called with
// mu held.
func (h *history) points(r *ring, limit int) []Point {
	first := 1
	if limit >= 0 && h.n-limit > first {
		first = h.n - limit
	}
	out := make([]Point, 0, max(h.n-first, 0))
	for i := first; i < h.n; i++ {
		a, b := h.at(i-1), h.at(i)
		if p, ok := between(h.times[a], h.times[b], &r[a], &r[b]); ok {
			out = append(out, p)
		}
	}
	return out
}

// rates are scope's rates over about RateWindow: from the newest sample and the newest one
// at least RateWindow - HistoryEvery/2 older (the oldest held, while the history is younger).
// Called with mu held.
func (h *history) rates(r *ring) *Rates {
	if h.n < 2 {
		return nil
	}
	last := h.at(h.n - 1)
	from := h.at(0)
	for i := h.n - 2; i >= 0; i-- {
		if h.times[last].Sub(h.times[h.at(i)]) >= RateWindow-HistoryEvery/2 {
			from = h.at(i)
			break
		}
	}
	p, ok := between(h.times[from], h.times[last], &r[from], &r[last])
	if !ok {
		return nil
	}
	return &Rates{Window: h.times[last].Sub(h.times[from]).Seconds(), PerSecond: p.Rates, AddedMillis: p.AddedMillis}
}

// between is what happened from sample a (at ta) to sample b (at tb).
func between(ta, tb time.Time, a, b *counters) (Point, bool) {
	dt := tb.Sub(ta).Seconds()
	if dt <= 0 {
		return Point{}, false
	}
	p := Point{At: tb, AddedCount: b[addedCount] - a[addedCount]}
	for i := range p.Rates {
		p.Rates[i] = float64(b[i]-a[i]) / dt
	}
	if p.AddedCount > 0 {
		p.AddedMillis = float64(b[addedNanos]-a[addedNanos]) / float64(p.AddedCount) / 1e6
	}
	return p, true
}

// recent are scope's RecentPoints newest points and its rates, for a view.
func (h *history) recent(scope Scope) ([]Point, *Rates) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.series(scope)
	if r == nil {
		return nil, nil
	}
	return h.points(r, RecentPoints), h.rates(r)
}

// whole is scope's History.
func (h *history) whole(scope Scope) History {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := History{Every: HistoryEvery.Seconds(), Length: HistoryLength.Seconds(), Points: []Point{}}
	r := h.series(scope)
	if r == nil {
		return out
	}
	out.Kept = true
	out.Points, out.Rates = h.points(r, -1), h.rates(r)
	return out
}

// decodeCounts reads what the history needs of a raw snapshot.
func decodeCounts(b []byte) (procCounts, error) {
	var p procCounts
	err := json.Unmarshal(b, &p)
	return p, err
}
