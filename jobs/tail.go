package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsretry"
)

// ErrChunksLost ends the feeds of a hub whose tail found CHUNKS recreated (every server that
// held it restarted): their chunks are gone, and their followers answer from the records.
var ErrChunksLost = fmt.Errorf("%w: CHUNKS was recreated", ErrEnded)

// tailPrefix starts the names of the tails' consumers (IsTail).
const tailPrefix = "og_tail_"

// IsTail reports whether a CHUNKS consumer's name is a hub's tail (nats.go names an ordered
// consumer <prefix>_<serial>): the only consumers a hub makes, one per running API process.
func IsTail(consumer string) bool { return strings.HasPrefix(consumer, tailPrefix) }

// tail is a cluster node's one reader of CHUNKS: an ordered consumer on every subject,
// delivering from the moment it was made, whose chunks the hub routes to its feeds. It is made
// by the first feed (start) and lives until the hub closes; nats.go recreates the server's
// consumer from the next sequence after a reconnect or a leader change, so it has no gap.
type tail struct {
	hub *Hub

	mu      sync.Mutex
	cons    jetstream.Consumer
	cc      jetstream.ConsumeContext
	stopped bool

	seq atomic.Uint64 // the stream sequence of the last chunk read
}

// start makes the tail unless it runs; a creation that fails with an election's errors is
// tried again (jsretry).
func (t *tail) start(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return ErrHubClosed
	}
	if t.cc != nil {
		return nil
	}
	h := t.hub
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		// From the sequence after the stream's last, not DeliverNew: nats.go makes an ordered
		// consumer again (a reconnect, its consumer lost) from the sequence after the last
		// message it delivered, but one that delivered nothing yet is made with the policy it
		// was given, and "new" then skipped every chunk stored in between. On a cluster whose
		// outcomes are notices a tail can go a long time without a chunk (CI lost one that
		// way, jobs/TestNoticesOnACluster).
		st, err := h.js.Stream(ctx, h.chunks)
		if err != nil {
			return err
		}
		cons, err := h.js.OrderedConsumer(ctx, h.chunks, jetstream.OrderedConsumerConfig{
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       st.CachedInfo().State.LastSeq + 1,
			InactiveThreshold: h.inactive,
			NamePrefix:        tailPrefix + NewID(),
		})
		if err != nil {
			return err
		}
		cc, err := cons.Consume(t.read, jetstream.PullHeartbeat(orderedHeartbeat),
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				h.log.Debug().Err(err).Msg("CHUNKS tail")
			}))
		if err != nil {
			return err
		}
		t.cons, t.cc = cons, cc
		return nil
	})
	if err != nil {
		return fmt.Errorf("jobs: read %s: %w", h.chunks, err)
	}
	return nil
}

// StartTail makes the hub's tail now instead of at its first feed (nothing on one server,
// which has none). Creating a consumer is a change of the cluster's meta group: a tail made
// while the cluster has a quorum keeps reading through a loss of the meta quorum that leaves
// the hub's partition up (a partitioned cluster that lost another partition's servers), where
// making it at the first feed would fail every request.
func (h *Hub) StartTail(ctx context.Context) error {
	if h.coreFast {
		return nil
	}
	return h.tail.start(ctx)
}

func (t *tail) read(m jetstream.Msg) {
	if md, err := m.Metadata(); err == nil {
		t.seq.Store(md.Sequence.Stream)
	}
	t.hub.route(m.Subject(), m.Headers(), m.Data())
}

// stop ends the tail and deletes its consumer (once; the server expires it otherwise).
func (t *tail) stop() {
	t.mu.Lock()
	cc, cons := t.cc, t.cons
	t.cc, t.cons, t.stopped = nil, nil, true
	t.mu.Unlock()
	t.end(cc, cons)
}

// end stops a consume loop and deletes the consumer it used last.
func (t *tail) end(cc jetstream.ConsumeContext, cons jetstream.Consumer) {
	if cc == nil {
		return
	}
	cc.Stop()
	<-cc.Closed()
	if info := cons.CachedInfo(); info != nil {
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		defer cancel()
		if err := t.hub.js.DeleteConsumer(ctx, t.hub.chunks, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.hub.log.Debug().Err(err).Str("consumer", info.Name).Msg("deleting the CHUNKS tail failed; the server expires it")
		}
	}
}

// Resync checks, after a reconnect, that CHUNKS still holds what the tail read. A stream
// recreated after every server that held it restarted begins again at sequence 1, where the
// tail, which asks for the sequence after its last, would wait for ever: the tail is made
// again from the new stream's end, and the feeds that were open end with ErrChunksLost (their
// followers answer from the records). One stream info request; nothing on one server, which
// has no tail.
func (h *Hub) Resync(ctx context.Context) error {
	t := &h.tail
	t.mu.Lock()
	running := t.cc != nil
	t.mu.Unlock()
	if !running {
		return nil
	}
	st, err := h.js.Stream(ctx, h.chunks)
	if err != nil {
		return fmt.Errorf("jobs: resync: %w", err)
	}
	if st.CachedInfo().State.LastSeq >= t.seq.Load() {
		return nil
	}
	h.log.Warn().Uint64("read", t.seq.Load()).Uint64("stream_last", st.CachedInfo().State.LastSeq).
		Msg("CHUNKS was recreated; reading it again from its end")
	t.mu.Lock()
	cc, cons := t.cc, t.cons
	t.cc, t.cons = nil, nil
	t.mu.Unlock()
	t.end(cc, cons)
	t.seq.Store(0)
	h.endStreamed(ErrChunksLost)
	return t.start(ctx)
}
