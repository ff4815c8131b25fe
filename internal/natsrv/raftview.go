package natsrv

import (
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/oncegate/oncegate/internal/replicas"
)

// StreamView reads stream's Raft group from this server's memory (no JetStream request, no
// message on the network): whether it has a leader this server hears from, since when, and
// whether that leader has heard from a quorum. It is what a leader-only request (stream info)
// would say, asked where the answer lives, so that a readiness or quorum watch costs nothing
// when the cluster is idle (issue 44). ok is false when this server cannot tell: the stream
// has no replica here, or this server follows a group of more than three (its own contact
// with the leader makes two, not a quorum); the caller then asks the leader. Safe for
// concurrent use.
//
// On a single server (no cluster) every stream is led here and quorate.
func (s *Server) StreamView(stream string) (replicas.View, bool) {
	if !s.ns.JetStreamIsClustered() {
		return replicas.View{Leader: s.ns.Name(), Quorate: true, Leads: true}, true
	}
	g, ok := s.raftGroup(stream)
	if !ok {
		return replicas.View{}, false
	}
	return s.views.view(stream, g, s.ns.Name(), time.Now())
}

// account is the account the embedded server keeps every stream in (no accounts configured).
const account = server.DEFAULT_GLOBAL_ACCOUNT

// raftGroup is stream's Raft group as this server holds it; the group's name is looked up
// once (a Jsz, which reads every stream's state) and again when the group is gone (the stream
// was recreated under a new group).
func (s *Server) raftGroup(stream string) (server.RaftzGroup, bool) {
	if name := s.views.groupName(stream); name != "" {
		if g, ok := s.raftz(name); ok {
			return g, true
		}
	}
	det, err := s.ns.JszAccount(&server.JSzOptions{Account: account, Streams: true, RaftGroups: true})
	if err != nil {
		return server.RaftzGroup{}, false
	}
	for _, sd := range det.Streams {
		if sd.Name == stream && sd.RaftGroup != "" {
			s.views.setGroupName(stream, sd.RaftGroup)
			return s.raftz(sd.RaftGroup)
		}
	}
	return server.RaftzGroup{}, false
}

func (s *Server) raftz(group string) (server.RaftzGroup, bool) {
	st := s.ns.Raftz(&server.RaftzOptions{AccountFilter: account, GroupFilter: group})
	if st == nil {
		return server.RaftzGroup{}, false
	}
	g, ok := (*st)[account][group]
	return g, ok
}

// raftViews keeps, per stream, its group's name and the leader this server last saw.
type raftViews struct {
	mu     sync.Mutex
	groups map[string]string     // stream → Raft group name
	seen   map[string]seenLeader // stream → the leader last seen and since when
	// streams is the account's stream count when MissingStreams last found every name (0: never).
	streams int
}

// seenLeader is a leader as a follower first saw it: a new term is a new election, even of
// the same server.
type seenLeader struct {
	id    string
	term  uint64
	since time.Time
}

func (v *raftViews) groupName(stream string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.groups[stream]
}

func (v *raftViews) setGroupName(stream, group string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.groups == nil {
		v.groups = map[string]string{}
	}
	v.groups[stream] = group
}

// view turns g, as the server named self holds it, into a View at now (see StreamView).
func (v *raftViews) view(stream string, g server.RaftzGroup, self string, now time.Time) (replicas.View, bool) {
	heard := func(p server.RaftzGroupPeer) bool {
		d, err := time.ParseDuration(p.LastSeen)
		return err == nil && d <= replicas.Heard
	}
	switch {
	case g.State == server.Leader.String():
		n := 1 // itself
		for _, p := range g.Peers {
			if heard(p) {
				n++
			}
		}
		if g.LeaderSince == nil {
			// Elected, but not yet caught up with what it must apply: it does not answer
			// as the stream's leader yet (nor would a stream info request).
			return replicas.View{}, true
		}
		return replicas.View{Leader: self, Since: *g.LeaderSince, Quorate: n >= g.QuorumNeeded, Leads: true}, true
	case g.Leader == "":
		return replicas.View{}, true // an election: no leader to hear from
	}
	p, ok := g.Peers[g.Leader]
	if !ok || !heard(p) {
		return replicas.View{}, true // a leader it does not hear from answers nothing here either
	}
	if g.Size > 3 {
		return replicas.View{}, false // its own contact is not a quorum: ask the leader
	}
	// A follower in contact with the leader of a group of three (or two) is the leader's
	// quorum: the leader hears it (raft's replies) and itself.
	v.mu.Lock()
	if v.seen == nil {
		v.seen = map[string]seenLeader{}
	}
	sl := v.seen[stream]
	if sl.id != g.Leader || sl.term != g.Term {
		sl = seenLeader{id: g.Leader, term: g.Term, since: now}
		v.seen[stream] = sl
	}
	v.mu.Unlock()
	return replicas.View{Leader: p.Name, Since: sl.since, Quorate: true}, true
}

// MissingStreams is which of names this server's JetStream does not have, read from its
// memory: on a cluster the meta group's assignments; on a single server its account's stream
// count, and the streams' names only when the count fell since names were last all found
// (listing them reads every stream's state). No JetStream request.
func (s *Server) MissingStreams(names []string) (missing []string) {
	if s.ns.JetStreamIsClustered() {
		for _, n := range names {
			if !s.ns.JetStreamIsStreamAssigned(account, n) {
				missing = append(missing, n)
			}
		}
		return missing
	}
	count := -1
	if acc := s.ns.GlobalAccount(); acc != nil {
		count = acc.JetStreamUsage().Streams
	}
	s.views.mu.Lock()
	seen := s.views.streams
	if count >= seen && seen > 0 {
		s.views.streams = count
	}
	s.views.mu.Unlock()
	if count >= seen && seen > 0 {
		return nil
	}
	det, err := s.ns.JszAccount(&server.JSzOptions{Account: account, Streams: true})
	if err != nil {
		return names
	}
	defer func() {
		if len(missing) == 0 {
			s.views.mu.Lock()
			s.views.streams = len(det.Streams)
			s.views.mu.Unlock()
		}
	}()
	have := map[string]bool{}
	for _, sd := range det.Streams {
		have[sd.Name] = true
	}
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	return missing
}
