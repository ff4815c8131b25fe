package kv

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/replicas"
)

// A lease that ran out while the bucket had no leader says nothing about its owner: every
// renewal it sent failed until an election ended. Taking such a record over as soon as the
// election ends re-executes an intent whose first execution is alive and about to renew
// (the fault suite's row 3a: 5 re-executions after a takeover in 10 trials). So a record
// counts as abandoned only once its lease ran out AND the bucket has had the same leader for
// a whole grace period (a lease): time in which a live owner's renewal lands.

// A leader that stays elected can still lose its quorum: isolated from the other servers
// (the fault suite's row 3b), it answers reads but commits nothing, so every renewal fails
// while its election time stays old. A watch (WatchQuorum) therefore reads the leader every
// watchEvery and keeps when the bucket last became steady: answered by a leader that has
// heard from a quorum of its replicas lately, with no failed or missing read since. With a
// watch running, a record also needs the bucket steady for a whole grace period.

// leaderRefresh is how long a read of the bucket's leader election time is reused. An outage
// shorter than this cannot make a lease of seconds lapse; a longer one fails the reads it
// spans, which are never reused.
const leaderRefresh = 500 * time.Millisecond

// leaderReadTimeout bounds that read (callers hold no deadline of their own, e.g. the sweep).
const leaderReadTimeout = 2 * time.Second

// watchEvery is how often WatchQuorum reads the leader; watchGap is the longest time between
// two reads that still counts as watched without a break (a read may take leaderReadTimeout).
const (
	watchEvery = 250 * time.Millisecond
	watchGap   = watchEvery + leaderReadTimeout
)

// remoteWatchEvery is WatchQuorum's period while the server in this process holds no replica
// of the bucket (a partition placed on other servers): each read is then a stream info request
// to the leader, and at watchEvery the two stores of every such partition asked eight times a
// second per node. A slower watch only starts a steady run later (a takeover waits longer,
// never less); the gap that breaks a run grows with it. This server, holding no replica, is
// never the bucket's leader, so the watch has no isolation of it to find.
const remoteWatchEvery = 5 * time.Second

// leaderClock caches when the bucket's current leader was elected and how long it has been
// steady.
type leaderClock struct {
	mu     sync.Mutex
	readAt time.Time // when since was read (or failed to be); zero: never
	since  time.Time // the leader's election; zero: not known (a single server, an old one)
	name   string    // the leader's server name, as that read said ("" when it failed)
	ok     bool      // whether the read at readAt succeeded
	// steady is when the current run of reads that found a leader with a quorum began (zero:
	// the last read did not); watched says a WatchQuorum keeps the run going.
	steady  time.Time
	watched bool
	// cut says the last read was answered by a leader that has not heard from a quorum.
	cut bool
	// local, when set, reads the leader from the NATS server in this process (UseLocal).
	local replicas.Local
	// remote says the last read asked the leader (the server in this process could not tell):
	// the watch then reads every remoteWatchEvery.
	remote bool
}

// every is the watch's period for what the last read was (the lock held).
func (c *leaderClock) every() time.Duration {
	if c.remote {
		return remoteWatchEvery
	}
	return watchEvery
}

// UseLocal makes the store read the bucket's leader from the NATS server in this process
// (an embedded server that holds a replica of the bucket) instead of asking the leader with a
// stream info request, whenever local can tell: the same answer, read from the Raft group's
// memory, so that WatchQuorum's reads every watchEvery cost no JetStream request (issue 44).
// Call it before WatchQuorum.
func (s *Store) UseLocal(local replicas.Local) {
	s.leader.mu.Lock()
	defer s.leader.mu.Unlock()
	s.leader.local = local
}

// minGrace is the least time a bucket must have had its current leader before a lapsed lease
// counts as abandoned, whatever the lease: what a live owner cut off by the partition that
// made the election needs to see it (WatchQuorum: a second of lost quorum, read at most
// watchGap apart), move to another server and land one renewal (jsretry.PerTry). With the
// fault suite's 2 s lease a grace of one lease was shorter than that: in row 3b (100 trials on
// 5a486b7) takers on the majority side took over 4 owners that were still running, their
// renewals failing for 3-4 s, and the backend ran those intents twice. It bounds the election
// check only, not the steady run a watch keeps (every process starts one when it starts, and
// any read without a quorum ends one): applied to that run too, it held row 1's takeovers,
// where no election happens, about 7 s longer (20 trials: the longest wait for an answer
// 11.7 s, 4.8 s without it; which run ended them was not read from the logs).
const minGrace = isolatedAfter + watchGap + jsretry.PerTry

// Abandoned reports whether rec's owner has had a fair chance to renew its lease and did not:
// the lease ran out at now, the bucket's leader was elected at least grace (and minGrace)
// before now and, while a WatchQuorum runs, the bucket has been steady for grace. When the
// leader cannot be read (the bucket is itself unavailable) it says false: nobody can tell,
// and a takeover would fail to write anyway.
func (s *Store) Abandoned(ctx context.Context, rec *Record, now time.Time, grace time.Duration) bool {
	if !rec.LeaseExpired(now) {
		return false
	}
	since, ok := s.leaderSince(ctx)
	if !ok || (!since.IsZero() && now.Sub(since) < max(grace, minGrace)) {
		return false
	}
	s.leader.mu.Lock()
	defer s.leader.mu.Unlock()
	return !s.leader.watched || (!s.leader.steady.IsZero() && now.Sub(s.leader.steady) >= grace)
}

// isolatedAfter is how long the bucket's leader must keep answering without a quorum before
// WatchQuorum calls isolated; isolatedEvery is the least time between two calls.
const (
	isolatedAfter = time.Second
	isolatedEvery = 5 * time.Second
)

// WatchQuorum reads the bucket's leader every watchEvery until ctx ends, so Abandoned knows
// how long the bucket has been steady (the gateway runs one per store it opens).
//
// A leader that answers but has not heard from a quorum for isolatedAfter is, as this
// connection sees it, cut off from the other servers, and so most likely is the server this
// connection uses (a leader elsewhere that lost its routes would not answer at all): then
// isolated, if not nil, is called (at most every isolatedEvery), and the gateway moves the
// connection to another server. Its renewals then reach the majority's new leader instead of
// failing until the partition heals while a taker on the majority side waits out the lease.
// A server cut off while it leads nothing of the bucket is not seen: its requests time out,
// as during any election, and moving every connection in every election would cost more.
func (s *Store) WatchQuorum(ctx context.Context, isolated func()) {
	s.leader.mu.Lock()
	s.leader.watched = true
	s.leader.mu.Unlock()
	t := time.NewTimer(watchEvery)
	defer t.Stop()
	var cutSince, calledAt time.Time
	for {
		s.readLeader(ctx)
		s.leader.mu.Lock()
		cut, every := s.leader.cut, s.leader.every()
		s.leader.mu.Unlock()
		t.Reset(every)
		switch now := time.Now(); {
		case !cut:
			cutSince = time.Time{}
		case cutSince.IsZero():
			cutSince = now
		case isolated != nil && now.Sub(cutSince) >= isolatedAfter && now.Sub(calledAt) >= isolatedEvery:
			calledAt = now
			isolated()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// LeaderSeen is the bucket's leader as the last leader read found it: its server name and
// when it was elected ("" and zero when unknown). For a taker's log: a takeover in row 3b
// (trial 15 on 2f0556c) came earlier than minGrace allows after the majority's election, and
// the log could not say which server's answer the decision had read.
func (s *Store) LeaderSeen() (string, time.Time) {
	s.leader.mu.Lock()
	defer s.leader.mu.Unlock()
	return s.leader.name, s.leader.since
}

// leaderSince is when the bucket's stream leader was elected (zero when the server does not
// say), read at most every leaderRefresh; false when it could not be read. A failed read is
// reused too: a sweep asks for every expired record, and each try waits for its timeout.
func (s *Store) leaderSince(ctx context.Context) (time.Time, bool) {
	s.leader.mu.Lock()
	if !s.leader.readAt.IsZero() && time.Since(s.leader.readAt) < leaderRefresh {
		defer s.leader.mu.Unlock()
		return s.leader.since, s.leader.ok
	}
	s.leader.mu.Unlock()
	return s.readLeader(ctx)
}

// readLeader reads the bucket's leader, from the server in this process when it can tell
// (UseLocal), else from the leader's stream info, and records what it says.
func (s *Store) readLeader(ctx context.Context) (time.Time, bool) {
	start := time.Now()
	v, remote, err := s.leaderView(ctx)
	s.leader.mu.Lock()
	defer s.leader.mu.Unlock()
	gap := s.leader.every() + leaderReadTimeout // the last read's period: a longer wait is a break
	s.leader.remote = remote
	prev := s.leader.readAt
	s.leader.readAt, s.leader.since, s.leader.ok, s.leader.name = time.Now(), v.Since, err == nil, v.Leader
	s.leader.cut = err == nil && !v.Quorate
	switch {
	case err != nil || !v.Quorate:
		s.leader.steady = time.Time{}
	case s.leader.steady.IsZero() || start.Sub(prev) > gap:
		s.leader.steady = start // a run starts with this read, not at the last one
	}
	return s.leader.since, s.leader.ok
}

// errNoLeaderHeard is leaderView's error when the server in this process hears from no leader
// of the bucket: as a request would, the read fails.
var errNoLeaderHeard = errors.New("kv: no leader of the bucket is heard from")

// leaderView is the bucket's leader: from the server in this process when it can tell, else
// from the leader's stream info (Quorate as replicas.Quorate reads it). remote says there is a
// server in this process and it holds no replica of the bucket (a partition placed on other
// servers). On an external NATS (no server here) every read asks, at watchEvery as before:
// there the watch also finds this connection's server cut off (row 3b).
func (s *Store) leaderView(ctx context.Context) (v replicas.View, remote bool, err error) {
	s.leader.mu.Lock()
	local := s.leader.local
	s.leader.mu.Unlock()
	if local != nil {
		if v, ok := local(s.names.stream); ok {
			if v.Leader == "" {
				return v, false, errNoLeaderHeard
			}
			return v, false, nil
		}
	}
	rctx, cancel := context.WithTimeout(ctx, leaderReadTimeout)
	defer cancel()
	st, err := s.js.Stream(rctx, s.names.stream)
	if err != nil {
		return replicas.View{}, local != nil, err
	}
	cl := st.CachedInfo().Cluster
	v = replicas.View{Quorate: replicas.Quorate(cl)}
	if cl != nil {
		v.Leader = cl.Leader
		if cl.LeaderSince != nil {
			v.Since = *cl.LeaderSince
		}
	}
	return v, local != nil, nil
}
