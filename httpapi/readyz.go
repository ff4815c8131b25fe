package httpapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/internal/partition"
)

// /readyz answers from a verdict this node already holds, never from a JetStream round trip:
// after a peer was killed, a check asked on the request path waited for its timeouts, and a
// load balancer whose health check allows 1 s took every node out (issue 34). WatchReadiness
// refreshes the verdict in the background.
const (
	// readyEvery is how often WatchReadiness asks.
	readyEvery = time.Second
	// ReadyProbeTimeout bounds one readiness check, every JetStream request of it together: a
	// check that has not been answered by then (no leader, no quorum) says not ready.
	ReadyProbeTimeout = time.Second
	// readyStale is the age past which a verdict is no longer believed: the loop has stopped,
	// or is stuck, and the node says not ready rather than repeat an old yes.
	readyStale = 4*ReadyProbeTimeout + readyEvery
)

// readiness is /readyz's last verdict, written by WatchReadiness, read by every poller.
type readiness struct {
	mu     sync.Mutex
	at     time.Time // when the check that gave reason ended; zero: none has yet
	reason string    // why not ready; "" = ready
	// reconnects is the connection's reconnect count when the check began: a verdict from
	// before a reconnect is not believed (see readyz).
	reconnects uint64
}

func (r *readiness) set(reason string, at time.Time, reconnects uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reason, r.at, r.reconnects = reason, at, reconnects
}

func (r *readiness) get() (string, time.Time, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reason, r.at, r.reconnects
}

// reconnects is how often this node's NATS connection has reconnected.
func (s *Server) reconnects() uint64 { return s.nc.Stats().Reconnects }

// ResourceChecker says whether this node can admit a request as far as JetStream goes: nil
// when every stream and bucket the gateway needs exists and the ones an admission writes can
// take a write now, else an error that says why not. It is called by WatchReadiness only, with
// a deadline.
type ResourceChecker interface {
	Check(ctx context.Context) error
}

// PartitionReporter is a ResourceChecker of a partitioned store that also tells what its last
// checks found of each partition (/readyz lists them when there are more than one).
type PartitionReporter interface {
	Partitions() []partition.State
}

// readyz is 200 exactly while this API node can admit a request, as its last readiness check
// (WatchReadiness, every readyEvery) found it, and 503 with the reason otherwise, so a load
// balancer sends requests only where they would be admitted. Admitting needs: a connection to
// NATS (read on each call), every stream and bucket present (memory streams are lost with a
// NATS restart until the gateway recreates them), the streams of the IDEM bucket and of JOBS
// each with a leader that has heard from a quorum of its replicas (it can commit the record and
// the job), and the cold tier, when there is one, able to tell a new key from a moved one, all
// within ReadyProbeTimeout (ResourceChecker); and at least one worker posting to
// the status board (a worker posts every 2 s while its pool consumes JOBS and removes its
// entry when it stops; one that died without stopping drops off when the entry expires, 10 s).
// It never asks JetStream itself: it answers at once, whatever the cluster does.
func (s *Server) readyz(c *fiber.Ctx) error {
	if s.nc == nil || !s.nc.IsConnected() {
		return writeAPIError(c, unavailable("not connected to NATS"))
	}
	reason, at, reconnects := s.ready.get()
	switch now := s.now(); {
	case at.IsZero():
		return writeAPIError(c, unavailable("readiness not checked yet"))
	case reconnects != s.reconnects():
		// The server this node was connected to went away: what the last check found there
		// says nothing about the one it reconnected to (a survivor without a quorum). Seen in
		// TestReadyzAnswersAtOnceWithoutQuorum: 200 for up to a second after the reconnect.
		return writeAPIError(c, unavailable("reconnected to NATS; readiness not checked since"))
	case now.Sub(at) > readyStale:
		return writeAPIError(c, unavailable(fmt.Sprintf("readiness last checked %s ago", now.Sub(at).Round(time.Second))))
	case reason != "":
		return writeAPIError(c, unavailable(reason))
	}
	if pr, ok := s.resources.(PartitionReporter); ok {
		if parts := pr.Partitions(); len(parts) > 1 {
			return c.JSON(fiber.Map{"status": "ready", "partitions": parts})
		}
	}
	return c.JSON(fiber.Map{"status": "ready"})
}

// WatchReadiness checks whether this node can admit a request at once and then every
// readyEvery, each check bounded by ReadyProbeTimeout, and keeps the verdict /readyz answers
// from. It returns when ctx ends; the gateway runs it in a goroutine it owns and stops it
// after the HTTP server.
func (s *Server) WatchReadiness(ctx context.Context) {
	t := time.NewTicker(readyEvery)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, ReadyProbeTimeout)
		var reconnects uint64
		if s.nc != nil {
			reconnects = s.reconnects()
		}
		reason := s.checkReady(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.ready.set(reason, s.now(), reconnects)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkReady is one readiness check: "" when this node can admit, else why not. While the
// cluster is idle it asks JetStream nothing (issue 44): the resources check answers from
// what the node already holds, and the workers are counted from their posts as they cross
// this node's connection; the board is read (a KV watcher: a consumer) only while no post
// has been seen, at start or with no worker running.
func (s *Server) checkReady(ctx context.Context) string {
	if s.nc == nil || !s.nc.IsConnected() {
		return "not connected to NATS"
	}
	if s.resources != nil {
		if err := s.resources.Check(ctx); err != nil {
			return err.Error()
		}
	}
	if s.status == nil { // no board (a bare API in unit tests): nothing to say about workers
		return ""
	}
	if s.workers != nil && s.workers.Workers() > 0 {
		return ""
	}
	ws, err := s.status.Read(ctx)
	if err != nil {
		return "the workers' status board cannot be read"
	}
	if len(ws) == 0 {
		return "no worker is running: no worker has posted to the status board, so requests would wait in the JOBS queue"
	}
	return ""
}
