package intent

import (
	"sync"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// maxLiveKeys bounds liveKeys; past it, entries whose execution this node no longer follows
// are dropped (and all of them if that is not enough).
const maxLiveKeys = 16384

// liveKeys remembers, for the executions this node follows, the PENDING record each was
// claimed or joined with, so that another copy of the same intent arriving at this node joins
// the live feed at once, without the claim attempt and record read that would only say what
// the node already knows. An entry is used only while the node's hub still follows that
// execution and the remembered lease has not run out (until then no takeover can have moved
// the key to another epoch); otherwise the normal path decides. Records are kept without their
// request body.
type liveKeys struct {
	mu sync.Mutex
	m  map[string]*kv.Record
}

func newLiveKeys() *liveKeys { return &liveKeys{m: map[string]*kv.Record{}} }

// put remembers the PENDING record rec of key.
func (l *liveKeys) put(key string, rec *kv.Record, following func(subject string) bool) {
	slim := *rec
	slim.Request, slim.Header, slim.Result = nil, nil, nil
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) >= maxLiveKeys {
		for k, r := range l.m {
			if !following(jobs.ChunkSubject(k, r.JobID, r.Epoch)) {
				delete(l.m, k)
			}
		}
		if len(l.m) >= maxLiveKeys {
			clear(l.m)
		}
	}
	l.m[key] = &slim
}

func (l *liveKeys) get(key string) (*kv.Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec, ok := l.m[key]
	return rec, ok
}

func (l *liveKeys) forget(key string) {
	l.mu.Lock()
	delete(l.m, key)
	l.mu.Unlock()
}

// joinLocal joins req to an execution of its key that this node is following, if it can
// decide that without reading the record: same tenant and fingerprint, an auto key still
// inside its window (or a declared retry), the remembered lease still running. ok false: take
// the normal path, which reads the record and answers every other case (including the errors).
func (c *Core) joinLocal(req *Request) (*Admission, bool) {
	if req.Bypass {
		return nil, false
	}
	rec, ok := c.live.get(req.Key)
	if !ok {
		return nil, false
	}
	now := c.now()
	if rec.Tenant != req.Tenant || rec.Fingerprint != req.Fingerprint || !now.Before(rec.LeaseUntil) {
		return nil, false
	}
	rule := c.match(req, rec, now)
	if rule == "" {
		return nil, false
	}
	fl, ok := c.hubOf(req.Key).JoinLive(jobs.ChunkSubject(req.Key, rec.JobID, rec.Epoch))
	if !ok {
		c.live.forget(req.Key)
		return nil, false
	}
	leave, err := c.join(req, req.Key, rec) // after the feed: see attach
	if err != nil {
		fl.Close()
		return nil, false // the normal path meets the same cap and answers it
	}
	return explain(c.admission(Joined, req.Key, rec, fl, leave), rule, req.RetryHeader, rec), true
}

// remember records that this node follows key's execution at rec.
func (c *Core) remember(key string, rec *kv.Record) {
	if rec.State == kv.Pending && !rec.Bypassed {
		c.live.put(key, rec, c.hubOf(key).Following)
	}
}
