package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
)

// A worker pool's presence: while its connection is up, the pool answers on a subject of its
// own, exec.pool.<token of its id>. NATS answers a request with "no responders" only when no
// subscription to its subject exists in the servers the asker's server reaches, so a pool
// whose process died (its connection closed, its interest withdrawn across the routes) is
// told from a pool that is merely slow, which a timeout cannot do. A taker that finds the
// owner of a PENDING record gone this way need not wait for the owner's lease to run out
// (issue 34: a killed worker's intents waited the whole 15 s lease).
//
// What it cannot tell: an owner whose connection is moving to another server (nats.go
// reconnects within milliseconds, and subscribes again), hence PoolGone asks over a span;
// and an owner on a server whose route to the asker's server is cut while both still reach a
// third (NATS does not route interest through a third server). Such an owner loses its
// execution to the taker, whose epoch fences it: one answer, at worst a second backend call.

// poolPrefix starts a pool's presence subject.
const poolPrefix = "exec.pool."

// poolSubject is the presence subject of pool id (hashed: an id is a host name and a pid,
// and a host name may hold dots).
func poolSubject(id string) string {
	sum := sha256.Sum256([]byte(id))
	return poolPrefix + hex.EncodeToString(sum[:12])
}

// AnswerPresence answers for pool id on nc until the caller unsubscribes (or nc closes).
func AnswerPresence(nc *nats.Conn, id string) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(poolSubject(id), func(m *nats.Msg) {
		if m.Reply != "" {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		return nil, err
	}
	return sub, nil
}

// PresenceSpan and PresenceEvery: PoolGone asks every PresenceEvery for PresenceSpan, and a
// pool is gone only if every answer was "no responders" (longer than a connection's move to
// another server takes).
const (
	PresenceSpan  = 1500 * time.Millisecond
	PresenceEvery = 500 * time.Millisecond
)

// PoolGone reports whether pool id has been absent for PresenceSpan: every ask, from now on
// until the span is over, said "no responders". An answer, a timeout (a paused or overloaded
// process), any other error or ctx ending says not gone. It blocks for the span when gone.
func PoolGone(ctx context.Context, nc *nats.Conn, id string) bool {
	subject := poolSubject(id)
	end := time.Now().Add(PresenceSpan)
	for {
		rctx, cancel := context.WithTimeout(ctx, RunningWait)
		_, err := nc.RequestWithContext(rctx, subject, nil)
		cancel()
		if !errors.Is(err, nats.ErrNoResponders) {
			return false
		}
		if !time.Now().Before(end) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(PresenceEvery):
		}
	}
}
