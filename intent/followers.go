package intent

import "sync"

// followers counts the copies that follow each live execution on this node, for
// oncegate_followers_per_execution: an admission with a feed (created, joined, bypassed)
// joins its key's count, and Done leaves it; when the last copy leaves, the execution has
// ended for this node and the number of copies that followed it is observed. The count is
// per node: the copies on other API nodes are observed there.
type followers struct {
	mu sync.Mutex
	m  map[string]*followCount
}

type followCount struct{ live, total int }

func newFollowers() *followers { return &followers{m: map[string]*followCount{}} }

// followed adds a copy of key's execution; leave (call once) removes it.
func (c *Core) followed(key string) (leave func()) {
	f := c.followers
	f.mu.Lock()
	fc := f.m[key]
	if fc == nil {
		fc = &followCount{}
		f.m[key] = fc
	}
	fc.live++
	fc.total++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		fc.live--
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
