package intent

import (
	"cmp"
	"slices"

	"github.com/oncegate/oncegate/dashboard"
)

// Following lists the live executions this node's copies follow, for the dashboard: at most
// max rows (those with the most joined copies first) of total.
func (c *Core) Following(max int) (rows []dashboard.Follow, total int) {
	f := c.followers
	if f == nil {
		return nil, 0
	}
	f.mu.Lock()
	rows = make([]dashboard.Follow, 0, min(len(f.m), max))
	for _, fc := range f.m {
		rows = append(rows, dashboard.Follow{JobID: fc.jobID, Tenant: fc.tenant, Joined: fc.joined, Copies: fc.live})
	}
	f.mu.Unlock()
	total = len(rows)
	if total > max {
		slices.SortFunc(rows, func(a, b dashboard.Follow) int {
			return cmp.Or(cmp.Compare(b.Joined, a.Joined), cmp.Compare(a.JobID, b.JobID))
		})
		rows = rows[:max]
	}
	return rows, total
}
