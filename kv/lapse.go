package kv

import (
	"context"
	"sync"
	"time"
)

// A lease that ran out while the bucket had no leader says nothing about its owner: every
// renewal it sent failed until an election ended. Taking such a record over as soon as the
// election ends re-executes an intent whose first execution is alive and about to renew
// (the fault suite's row 3a: 5 re-executions after a takeover in 10 trials). So a record
// counts as abandoned only once its lease ran out AND the bucket has had the same leader for
// a whole grace period (a lease): time in which a live owner's renewal lands.

// leaderRefresh is how long a read of the bucket's leader election time is reused. An outage
// shorter than this cannot make a lease of seconds lapse; a longer one fails the reads it
// spans, which are never reused.
const leaderRefresh = 500 * time.Millisecond

// leaderReadTimeout bounds that read (callers hold no deadline of their own, e.g. the sweep).
const leaderReadTimeout = 2 * time.Second

// leaderClock caches when the bucket's current leader was elected.
type leaderClock struct {
	mu     sync.Mutex
	readAt time.Time // when since was read (or failed to be); zero: never
	since  time.Time // the leader's election; zero: not known (a single server, an old one)
	ok     bool      // whether the read at readAt succeeded
}

// Abandoned reports whether rec's owner has had a fair chance to renew its lease and did not:
// the lease ran out at now, and the bucket's leader was elected at least grace before now.
// When the leader cannot be read (the bucket is itself unavailable) it says false: nobody
// can tell, and a takeover would fail to write anyway.
func (s *Store) Abandoned(ctx context.Context, rec *Record, now time.Time, grace time.Duration) bool {
	if !rec.LeaseExpired(now) {
		return false
	}
	since, ok := s.leaderSince(ctx)
	return ok && (since.IsZero() || now.Sub(since) >= grace)
}

// leaderSince is when the bucket's stream leader was elected (zero when the server does not
// say), read at most every leaderRefresh; false when it could not be read. A failed read is
// reused too: a sweep asks for every expired record, and each try waits for its timeout.
func (s *Store) leaderSince(ctx context.Context) (time.Time, bool) {
	s.leader.mu.Lock()
	defer s.leader.mu.Unlock()
	if !s.leader.readAt.IsZero() && time.Since(s.leader.readAt) < leaderRefresh {
		return s.leader.since, s.leader.ok
	}
	rctx, cancel := context.WithTimeout(ctx, leaderReadTimeout)
	defer cancel()
	st, err := s.js.Stream(rctx, BucketStream)
	s.leader.readAt, s.leader.since, s.leader.ok = time.Now(), time.Time{}, err == nil
	if err == nil {
		if cl := st.CachedInfo().Cluster; cl != nil && cl.LeaderSince != nil {
			s.leader.since = *cl.LeaderSince
		}
	}
	return s.leader.since, s.leader.ok
}
