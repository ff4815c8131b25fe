package intent

import (
	"sync"
	"sync/atomic"

	"github.com/oncegate/oncegate/kv"
)

// followers counts the copies that follow each live execution on this node, for
// oncegate_followers_per_execution and the tenants' followers per job: an admission with a
// feed (created, joined, bypassed) joins its key's count, and Done leaves it; when the last copy leaves, the execution has
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

// follow adds a copy of key's execution (rec's job), unless perJob (> 0) copies already
// follow it here: then a *LimitError. leave (call once) removes it.
func (c *Core) follow(key string, rec *kv.Record, joined bool, perJob int) (leave func(), err error) {
	f := c.followers
	f.mu.Lock()
	fc := f.m[key]
	if fc == nil {
		fc = &followCount{jobID: rec.JobID, tenant: rec.Tenant}
		f.m[key] = fc
	}
	if perJob > 0 && fc.live >= perJob {
		f.mu.Unlock()
		return nil, &LimitError{Limit: "followers_per_job", Cap: float64(perJob), RetryAfter: heldRetry}
	}
	fc.live++
	fc.total++
	if joined {
		fc.joined++
	}
	f.mu.Unlock()
	var left atomic.Bool
	return func() {
		if !left.CompareAndSwap(false, true) {
			return
		}
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
	}, nil
}
