package intent

import (
	"container/list"
	"sync"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// finishedCache keeps the final records of explicit keys that were replayed, so the next replay
// of the same key costs no JetStream round trip and no decode.
//
// It is sound across API nodes because such a record never changes again until its TTL removes
// it: a retryable failure is claimed again (so it is never cached), and an auto key moves on to
// the newest identical request (so auto keys are never cached). An entry expires when its
// record does (Result.Finished + TTL). The cache is bounded in bytes and evicts the least
// recently used entry; golang-lru bounds entries by count only, which would let a few
// multi-megabyte answers take any amount of memory.
type finishedCache struct {
	maxBytes int64
	mu       sync.Mutex
	size     int64
	order    *list.List // front = most recently used; values are *finishedEntry
	byKey    map[string]*list.Element
}

type finishedEntry struct {
	key     string
	rec     *kv.Record // shared and read-only
	rev     uint64
	expires time.Time
	size    int64
}

// recordOverhead approximates a record's memory besides its result bytes.
const recordOverhead = 512

func newFinishedCache(maxBytes int64) *finishedCache {
	return &finishedCache{maxBytes: maxBytes, order: list.New(), byKey: map[string]*list.Element{}}
}

// cacheable reports whether rec will never change again before it expires.
func cacheable(rec *kv.Record) bool {
	if rec.Auto || rec.Bypassed || rec.Result == nil || rec.Result.Finished.IsZero() {
		return false
	}
	switch rec.State {
	case kv.Completed:
		return true
	case kv.Failed:
		return !rec.Result.Retryable || rec.Cancelled // a retryable failure is claimed again
	}
	return false
}

// get returns the record held for key, if it has not expired at now.
func (c *finishedCache) get(key string, now time.Time) (*kv.Record, uint64, bool) {
	if c == nil {
		return nil, 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return nil, 0, false
	}
	e := el.Value.(*finishedEntry)
	if !now.Before(e.expires) {
		c.remove(el)
		return nil, 0, false
	}
	c.order.MoveToFront(el)
	return e.rec, e.rev, true
}

// put keeps rec (read-only from now on) until ttl after it finished, if it is cacheable and fits.
func (c *finishedCache) put(key string, rec *kv.Record, rev uint64, ttl time.Duration, now time.Time) {
	if c == nil || !cacheable(rec) {
		return
	}
	expires := rec.Result.Finished.Add(ttl)
	size := int64(recordOverhead + len(key) + len(rec.Result.Body) + len(rec.Result.Events) + len(rec.Result.UsageEvent))
	if !now.Before(expires) || size > c.maxBytes/8 { // one answer never takes more than an eighth
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.remove(el)
	}
	c.byKey[key] = c.order.PushFront(&finishedEntry{key: key, rec: rec, rev: rev, expires: expires, size: size})
	c.size += size
	for c.size > c.maxBytes {
		c.remove(c.order.Back())
	}
}

// forget drops key (its record turned out to have changed).
func (c *finishedCache) forget(key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.remove(el)
	}
}

func (c *finishedCache) remove(el *list.Element) {
	e := c.order.Remove(el).(*finishedEntry)
	delete(c.byKey, e.key)
	c.size -= e.size
}

// len is the number of entries (for tests).
func (c *finishedCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}

// finishedRecord is the cached final record of req's explicit key, if any.
func (c *Core) finishedRecord(req *Request) (*kv.Record, uint64, bool) {
	if req.Auto || req.Bypass {
		return nil, 0, false
	}
	return c.finished.get(req.Key, c.now())
}
