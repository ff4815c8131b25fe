package dashboard

import (
	"cmp"
	"slices"
	"time"
)

// Scope is what a viewer may see: every tenant (All), or one tenant's rows.
type Scope struct {
	All    bool
	Tenant string
}

// sees reports whether a row of tenant is in the scope.
func (s Scope) sees(tenant string) bool { return s.All || tenant == s.Tenant }

// View is what one dashboard shows: the cluster's latest snapshots, merged and filtered.
type View struct {
	At time.Time `json:"at"`
	// Tenant is the one tenant shown; empty when the viewer sees all of them.
	Tenant string `json:"tenant,omitempty"`
	// Nodes are the live processes (for an all-tenant viewer only).
	Nodes []NodeRow `json:"nodes,omitempty"`
	// Outcomes and the added latency's sum and count, summed over every live process since it
	// started (totals: a process that stops takes its part with it).
	Outcomes   [NumOutcomes]int64 `json:"outcomes"`
	AddedNanos int64              `json:"added_ns"`
	AddedCount int64              `json:"added_n"`
	// HitRatio is (joined + replayed) / (created + joined + replayed + bypassed), over the same
	// totals.
	HitRatio   float64        `json:"hit_ratio"`
	Executions []ExecutionRow `json:"executions"`
	// ExecutionsTotal counts every execution in flight in the scope; more than
	// len(Executions) when a process left rows out of its snapshot (MaxExecutions).
	ExecutionsTotal int       `json:"executions_total"`
	Truncated       bool      `json:"truncated,omitempty"`
	Backends        []Backend `json:"backends"`
	Money           []Money   `json:"money"`
	SpendMicros     int64     `json:"spend_micros"`
	SavedMicros     int64     `json:"saved_micros"`
	Avoided         int64     `json:"executions_avoided"`
	Reversals       int64     `json:"reversals"`
	Events          []Event   `json:"events"`
	// Rates are the outcomes per second over about RateWindow, and Points the newest
	// RecentPoints points of the charts, from the hub's history (the Hub sets them; nil for a
	// tenant past MaxHistoryTenants, and until the history has two samples).
	Rates  *Rates  `json:"rates,omitempty"`
	Points []Point `json:"points,omitempty"`
}

// NodeRow is one live process.
type NodeRow struct {
	Node  string    `json:"node"`
	Roles string    `json:"roles"`
	At    time.Time `json:"at"`
}

// ExecutionRow is an execution with the copies following it cluster-wide.
type ExecutionRow struct {
	Execution
	Followers int `json:"followers"`
}

// Aggregate merges the latest snapshot of every process (one each; snapshots older than
// SnapshotTTL at now are left out) into the view of scope.
func Aggregate(snaps []Snapshot, scope Scope, now time.Time) View {
	v := View{At: now, Executions: []ExecutionRow{}, Backends: []Backend{}, Money: []Money{}, Events: []Event{}}
	if !scope.All {
		v.Tenant = scope.Tenant
	}
	followers := map[string]int{}
	backends := map[string]*Backend{}
	latency := map[string][]float64{}
	money := map[[2]string]*Money{}
	for _, s := range snaps {
		if now.Sub(s.At) > SnapshotTTL {
			continue
		}
		if scope.All {
			v.Nodes = append(v.Nodes, NodeRow{Node: s.Node, Roles: s.Roles, At: s.At})
		}
		for _, c := range s.Counts {
			if !scope.sees(c.Tenant) {
				continue
			}
			for i, n := range c.Outcomes {
				v.Outcomes[i] += n
			}
			v.AddedNanos += c.AddedNanos
			v.AddedCount += c.AddedCount
			v.Reversals += c.Reversals
		}
		for _, f := range s.Follows {
			if scope.sees(f.Tenant) {
				followers[f.JobID] += f.Joined
			}
		}
		if s.FollowsTotal > len(s.Follows) {
			v.Truncated = true
		}
		shown := 0
		for _, e := range s.Executions {
			if !scope.sees(e.Tenant) {
				continue
			}
			shown++
			v.Executions = append(v.Executions, ExecutionRow{Execution: e})
		}
		v.ExecutionsTotal += shown
		if s.ExecutionsTotal > len(s.Executions) {
			v.Truncated = true
			if scope.All {
				v.ExecutionsTotal += s.ExecutionsTotal - len(s.Executions)
			}
		}
		for _, b := range s.Backends {
			m := backends[b.Name]
			if m == nil {
				m = &Backend{Name: b.Name, Breaker: b.Breaker}
				backends[b.Name] = m
			}
			if breakerRank(b.Breaker) > breakerRank(m.Breaker) {
				m.Breaker = b.Breaker
			}
			m.Requests += b.Requests
			m.Failures += b.Failures
			m.BudgetRequests += b.BudgetRequests
			m.Retries += b.Retries
			m.RetriesRefused += b.RetriesRefused
			if b.LatencyMillis > 0 {
				latency[b.Name] = append(latency[b.Name], b.LatencyMillis)
			}
		}
		for _, mo := range s.Money {
			if !scope.sees(mo.Tenant) {
				continue
			}
			k := [2]string{mo.Tenant, mo.Model}
			m := money[k]
			if m == nil {
				m = &Money{Tenant: mo.Tenant, Model: mo.Model}
				money[k] = m
			}
			m.SpendMicros += mo.SpendMicros
			m.Joined += mo.Joined
			m.Replayed += mo.Replayed
			m.SavedMicros += mo.SavedMicros
		}
		for _, e := range s.Events {
			if scope.sees(e.Tenant) {
				v.Events = append(v.Events, e)
			}
		}
	}
	for i := range v.Executions {
		v.Executions[i].Followers = followers[v.Executions[i].JobID]
	}
	slices.SortFunc(v.Executions, func(a, b ExecutionRow) int {
		return cmp.Or(a.Started.Compare(b.Started), cmp.Compare(a.JobID, b.JobID))
	})
	for name, b := range backends {
		if ls := latency[name]; len(ls) > 0 {
			b.LatencyMillis = slices.Max(ls) // the slowest worker's median: the one a request may meet
		}
		v.Backends = append(v.Backends, *b)
	}
	slices.SortFunc(v.Backends, func(a, b Backend) int { return cmp.Compare(a.Name, b.Name) })
	for _, m := range money {
		v.Money = append(v.Money, *m)
		v.SpendMicros += m.SpendMicros
		v.SavedMicros += m.SavedMicros
		v.Avoided += m.Joined + m.Replayed
	}
	slices.SortFunc(v.Money, func(a, b Money) int { return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Model, b.Model)) })
	slices.SortFunc(v.Events, func(a, b Event) int { return cmp.Or(b.At.Compare(a.At), cmp.Compare(a.JobID, b.JobID)) })
	if len(v.Events) > MaxEvents {
		v.Events = v.Events[:MaxEvents]
	}
	slices.SortFunc(v.Nodes, func(a, b NodeRow) int { return cmp.Compare(a.Node, b.Node) })
	o := v.Outcomes
	if answered := o[0] + o[1] + o[2] + o[3]; answered > 0 {
		v.HitRatio = float64(o[1]+o[2]) / float64(answered)
	}
	return v
}

// breakerRank orders breaker states from the healthiest.
func breakerRank(s string) int {
	switch s {
	case "open":
		return 2
	case "half-open", "half_open":
		return 1
	}
	return 0
}
