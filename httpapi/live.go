package httpapi

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
			if !following(jobs.ChunkSubject(k, r.Epoch)) {
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

// joinLocal joins g to an execution of its key that this node is following, if it can decide
// that without reading the record: same tenant and fingerprint, an auto key still inside its
// window (or a declared retry), the remembered lease still running. ok false: take the normal
// path, which reads the record and answers every other case (including the errors).
func (s *Server) joinLocal(g *generation) (*admission, bool) {
	if g.bypass {
		return nil, false
	}
	rec, ok := s.live.get(g.recKey)
	if !ok {
		return nil, false
	}
	now := s.now()
	if rec.Tenant != g.tenant || rec.Fingerprint != g.fingerprint || !now.Before(rec.LeaseUntil) ||
		(g.auto && !g.retry && now.Sub(rec.Created) > s.idem.AutoWindow.D()) {
		return nil, false
	}
	fl, ok := s.hub.JoinLive(jobs.ChunkSubject(g.recKey, rec.Epoch))
	if !ok {
		s.live.forget(g.recKey)
		return nil, false
	}
	return &admission{outcome: outcomeJoined, key: g.recKey, rec: rec, fl: fl, jobID: rec.JobID}, true
}

// remember records that this node follows key's execution at rec.
func (s *Server) remember(key string, rec *kv.Record) {
	if rec.State == kv.Pending && !rec.Bypassed {
		s.live.put(key, rec, s.hub.Following)
	}
}
