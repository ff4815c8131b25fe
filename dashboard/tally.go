package dashboard

import (
	"sync/atomic"
	"time"

	"github.com/oncegate/oncegate/internal/telemetry"
)

// Tally counts one API process's request outcomes and added latency per tenant, where
// httpapi counts them for oncegate_requests_total (the same decision feeds both). The
// tenants are fixed at construction (the configured ones and the anonymous tenant), so the
// request path is a map read and an atomic add, without lock or allocation. A nil *Tally
// counts nothing.
type Tally struct {
	byTenant map[string]*tenantTally
	order    []string
}

type tenantTally struct {
	outcomes   [NumOutcomes]atomic.Int64
	addedNanos atomic.Int64
	addedCount atomic.Int64
}

// NewTally counts for tenants (and telemetry.Anonymous).
func NewTally(tenants []string) *Tally {
	t := &Tally{byTenant: map[string]*tenantTally{}}
	for _, id := range append([]string{telemetry.Anonymous}, tenants...) {
		if _, ok := t.byTenant[id]; ok || id == "" {
			continue
		}
		t.byTenant[id] = &tenantTally{}
		t.order = append(t.order, id)
	}
	return t
}

// Request counts a request of tenant whose answer was decided with outcome o; outcomes past
// conflict (in use, rejected, degraded) and unknown tenants are not counted.
func (t *Tally) Request(tenant string, o telemetry.Outcome) {
	if t == nil || int(o) >= NumOutcomes {
		return
	}
	if tt := t.byTenant[tenant]; tt != nil {
		tt.outcomes[o].Add(1)
	}
}

// Added counts a created request's added latency.
func (t *Tally) Added(tenant string, d time.Duration) {
	if t == nil {
		return
	}
	if tt := t.byTenant[tenant]; tt != nil {
		tt.addedNanos.Add(int64(d))
		tt.addedCount.Add(1)
	}
}

// counts are the tenants that saw anything, with reversals from rev.
func (t *Tally) counts(rev map[string]int64) []Counts {
	if t == nil {
		return nil
	}
	var out []Counts
	for _, id := range t.order {
		tt := t.byTenant[id]
		c := Counts{Tenant: id, AddedNanos: tt.addedNanos.Load(), AddedCount: tt.addedCount.Load(), Reversals: rev[id]}
		any := c.AddedCount > 0 || c.Reversals > 0
		for i := range c.Outcomes {
			c.Outcomes[i] = tt.outcomes[i].Load()
			any = any || c.Outcomes[i] > 0
		}
		if any {
			out = append(out, c)
		}
	}
	return out
}
