package intent

import (
	"sync"

	"github.com/oncegate/oncegate/kv"
)

// followers counts the copies that follow each live execution on this node, for
// oncegate_followers_per_execution: an admission with a feed (created, joined, bypassed)
// joins its key's count, and Done leaves it; when the last copy leaves, the execution has
// ended for this node and the number of copies that followed it is observed. The count is
// per node: the copies on other API nodes are observed there.
type followers struct {
	mu sync.Mutex
	m  map[string]*followCount
}

type followCount struct {
	live, total int
	// joined counts the live copies that joined (the dashboard's followers); jobID and
	// tenant name the execution.
	joined        int
	jobID, tenant string
}

func newFollowers() *followers { return &followers{m: map[string]*followCount{}} }

// followed adds a copy of key's execution (rec's job); leave (call once) removes it.
func (c *Core) followed(key string, rec *kv.Record, joined bool) (leave func()) {
	f := c.followers
	f.mu.Lock()
	fc := f.m[key]
	if fc == nil {
		fc = &followCount{jobID: rec.JobID, tenant: rec.Tenant}
		f.m[key] = fc
	}
	fc.live++
	fc.total++
	if joined {
		fc.joined++
	}
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		fc.live--
		if joined {
			fc.joined--
		}
		ended := fc.live == 0
		if ended {
			delete(f.m, key)
		}
		f.mu.Unlock()
		if ended {
			c.metrics.Followers(fc.total)
		}
	}
}
