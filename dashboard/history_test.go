package dashboard

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"
)

// proc is a process's snapshot counters as the history reads them: tenant a's outcomes and
// added latency.
func proc(started time.Time, created, joined int64, addedMs, addedN int64) procCounts {
	return procCounts{At: started, Started: started, Counts: []Counts{{Tenant: "a",
		Outcomes: [NumOutcomes]int64{created, joined}, AddedNanos: addedMs * 1e6, AddedCount: addedN}}}
}

// old is the snapshots of one process "p" started before the history, with created counted.
func old(created int64) map[string]procCounts {
	return map[string]procCounts{"p": proc(t0.Add(-time.Hour), created, 0, 0, 0)}
}

// lumps are samples HistoryEvery apart of old(created) for each value.
func lumps(created ...int64) []step {
	var out []step
	for _, c := range created {
		out = append(out, step{HistoryEvery, old(c)})
	}
	return out
}

// step is one sample: the time since the previous one (the first: since t0) and the live
// processes' snapshots by bucket key.
type step struct {
	after time.Duration
	procs map[string]procCounts
}

// steady is n samples HistoryEvery apart of one process started before the history, whose
// created counter starts at base and grows by perStep each sample.
func steady(n int, base, perStep int64) []step {
	var out []step
	for i := range n {
		out = append(out, step{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), base+int64(i)*perStep, 0, 0, 0)}})
	}
	return out
}

// TestHistoryRates: the rate tiles' numbers are count deltas over the time between two
// samples about RateWindow apart, whatever the cadence the counters arrived at, and the
// history counts only what happened since it began, keeps what a stopped process counted and
// scopes to a tenant. The clock is the test's: sample times are given, not read.
func TestHistoryRates(t *testing.T) {
	a := Scope{Tenant: "a"}
	cases := []struct {
		name  string
		steps []step
		scope Scope
		// want: rates per second of created and joined, the window in seconds, the mean
		// added latency; nil rates wanted with wantNil.
		created, joined, window, addedMs float64
		wantNil                          bool
	}{
		{name: "one sample is no rate", steps: steady(1, 0, 10), scope: Scope{All: true}, wantNil: true},
		{name: "steady 5/s over the 10 s window", steps: steady(20, 0, 10), scope: Scope{All: true}, created: 5, window: 10},
		{name: "counts before the history began are not a rate", steps: steady(20, 1_000_000, 10), scope: Scope{All: true}, created: 5, window: 10},
		{name: "a young history's window is what it holds", steps: steady(3, 0, 10), scope: Scope{All: true}, created: 5, window: 4},
		{name: "a tenant sees its own counters", steps: steady(6, 0, 10), scope: a, created: 5, window: 10},
		{name: "a tenant that counted nothing sees zero", steps: steady(6, 0, 10), scope: Scope{Tenant: "b"}, window: 10},
		{
			// 30 requests in one lump, then nothing: 30 over the 10 s window, not 30 over the
			// interval it arrived in.
			name: "a lump is spread over the window", scope: Scope{All: true}, created: 3, window: 10,
			steps: lumps(7, 7, 37, 37, 37, 37),
		},
		{
			// Sampled late (3 s, then 1 s): the rate divides by the time that really passed.
			name: "uneven sample times divide by the real time", scope: Scope{All: true}, created: 4, window: 10,
			steps: []step{
				{HistoryEvery, old(0)},
				{3 * time.Second, old(12)},
				{1 * time.Second, old(16)},
				{2 * time.Second, old(24)},
				{2 * time.Second, old(32)},
				{2 * time.Second, old(40)},
			},
		},
		{
			// q starts after the history began with 20 created and 10 joined: all of them
			// count; p stops (its key is gone) and takes nothing away.
			name: "a new process adds all it counted, a stopped one takes nothing away", scope: Scope{All: true},
			created: 2, joined: 1, window: 10,
			steps: []step{
				{HistoryEvery, old(100)},
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 100, 0, 0, 0), "q": proc(t0.Add(3*time.Second), 20, 10, 0, 0)}},
				{HistoryEvery, map[string]procCounts{"q": proc(t0.Add(3*time.Second), 20, 10, 0, 0)}},
				{HistoryEvery, map[string]procCounts{"q": proc(t0.Add(3*time.Second), 20, 10, 0, 0)}},
				{HistoryEvery, map[string]procCounts{"q": proc(t0.Add(3*time.Second), 20, 10, 0, 0)}},
				{HistoryEvery, map[string]procCounts{"q": proc(t0.Add(3*time.Second), 20, 10, 0, 0)}},
			},
		},
		{
			name: "added latency is the mean of the window's created requests", scope: Scope{All: true}, created: 1, window: 10, addedMs: 3,
			steps: []step{
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 0, 0, 500, 100)}},
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 0, 0, 500, 100)}},
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 4, 0, 512, 104)}},
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 10, 0, 530, 110)}},
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 10, 0, 530, 110)}},
				{HistoryEvery, map[string]procCounts{"p": proc(t0.Add(-time.Hour), 10, 0, 530, 110)}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHistory()
			now := t0
			for _, s := range c.steps {
				now = now.Add(s.after)
				h.sample(now, s.procs)
			}
			_, r := h.recent(c.scope)
			if c.wantNil {
				if r != nil {
					t.Fatalf("rates %+v, want none", r)
				}
				return
			}
			if r == nil {
				t.Fatal("no rates")
			}
			got := fmt.Sprintf("created %.3f joined %.3f window %.3f added %.3f", r.PerSecond[0], r.PerSecond[1], r.Window, r.AddedMillis)
			want := fmt.Sprintf("created %.3f joined %.3f window %.3f added %.3f", c.created, c.joined, c.window, c.addedMs)
			if got != want {
				t.Errorf("got %s\nwant %s", got, want)
			}
		})
	}
}

// TestHistoryPoints: a point per sample interval with that interval's rates; the ring keeps
// HistoryLength and forgets what is older (its memory does not grow), and the views' recent
// points are the newest RecentPoints.
func TestHistoryPoints(t *testing.T) {
	h := newHistory()
	now := t0
	n := historySamples + 100 // wraps the ring
	for i := range n {
		now = now.Add(HistoryEvery)
		// created grows by 2i each interval: the i-th point reads i/s.
		h.sample(now, map[string]procCounts{"p": proc(t0.Add(-time.Hour), int64(i*(i+1)), 0, 0, 0)})
	}
	all := h.whole(Scope{All: true})
	if !all.Kept || len(all.Points) != historySamples-1 {
		t.Fatalf("kept %v, %d points, want %d", all.Kept, len(all.Points), historySamples-1)
	}
	if span := all.Points[len(all.Points)-1].At.Sub(all.Points[0].At); span != HistoryLength-HistoryEvery {
		t.Errorf("the points span %v, want %v", span, HistoryLength-HistoryEvery)
	}
	for j, p := range all.Points {
		i := n - len(all.Points) + j
		if want := float64(i); math.Abs(p.Rates[0]-want) > 1e-9 {
			t.Fatalf("point %d (sample %d) reads %v/s, want %v", j, i, p.Rates[0], want)
		}
	}
	if !all.Points[len(all.Points)-1].At.Equal(now) {
		t.Errorf("the newest point is at %v, want %v", all.Points[len(all.Points)-1].At, now)
	}
	recent, _ := h.recent(Scope{All: true})
	if len(recent) != RecentPoints || !recent[RecentPoints-1].At.Equal(now) || recent[0].Rates != all.Points[len(all.Points)-RecentPoints].Rates {
		t.Errorf("recent points %+v", recent)
	}
	b, err := json.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 120_000 {
		t.Errorf("the history is %d bytes of JSON, more than a dashboard should load on opening", len(b))
	}
}

// TestHistoryTenantBound: past MaxHistoryTenants, a tenant's history is not kept (and says
// so), while the all-tenants history still counts it.
func TestHistoryTenantBound(t *testing.T) {
	h := newHistory()
	counts := func(n int64) procCounts {
		p := procCounts{Started: t0.Add(time.Second)}
		for i := range MaxHistoryTenants + 1 {
			p.Counts = append(p.Counts, Counts{Tenant: fmt.Sprintf("t%03d", i), Outcomes: [NumOutcomes]int64{n}})
		}
		return p
	}
	h.sample(t0, nil)
	h.sample(t0.Add(HistoryEvery), map[string]procCounts{"p": counts(2)})
	kept, last := 0, ""
	for i := range MaxHistoryTenants + 1 {
		tn := fmt.Sprintf("t%03d", i)
		if h.whole(Scope{Tenant: tn}).Kept {
			kept++
		} else {
			last = tn
		}
	}
	if kept != MaxHistoryTenants || last == "" {
		t.Fatalf("%d tenants kept, want %d", kept, MaxHistoryTenants)
	}
	if pts, r := h.recent(Scope{Tenant: last}); pts != nil || r != nil {
		t.Errorf("tenant %s past the bound: points %v rates %v, want none", last, pts, r)
	}
	all := h.whole(Scope{All: true})
	if want := float64(2*(MaxHistoryTenants+1)) / HistoryEvery.Seconds(); len(all.Points) != 1 || all.Points[0].Rates[0] != want {
		t.Errorf("all tenants: %+v, want one point at %v/s", all.Points, want)
	}
}
