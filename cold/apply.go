package cold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// applyBatch bounds the OG_COLD messages and records one index commit holds (about).
const applyBatch = 4096

// expireEvery is how often the index drops the hours past the TTL.
const expireEvery = time.Minute

// applierHeartbeat is how often the server tells an idle applier it is alive. The ordered
// consumer is made again after two missed heartbeats: with nats.go's default of 5 s, one made
// while a fresh cluster settled and delivered nothing kept its node's tier behind (every new
// key 503, /readyz 503) for 10 s more: in 6 of 10 fresh three-node starts a node's tier was
// still behind 10 s after it opened, in none of 10 with 2 s. 2 s costs one small message per
// node every 2 s, as the hub's tail (jobs.orderedHeartbeat).
const applierHeartbeat = 2 * time.Second

// runApplier applies OG_COLD into the index until ctx ends, resuming after a failure from
// what the index applied.
func (t *Tier) runApplier(ctx context.Context) {
	for ctx.Err() == nil {
		if err := t.apply(ctx); err != nil && ctx.Err() == nil {
			t.cfg.Log.Warn().Err(err).Msg("cold tier: applying OG_COLD")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// apply reads OG_COLD from the index's applied sequence with one ordered consumer.
func (t *Tier) apply(ctx context.Context) error {
	cc := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if a := t.applied.Load(); a > 0 {
		cc = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: a + 1}
	}
	cons, err := t.js.OrderedConsumer(ctx, t.name, cc)
	if err != nil {
		return fmt.Errorf("cold: consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullHeartbeat(applierHeartbeat))
	if err != nil {
		return fmt.Errorf("cold: consume: %w", err)
	}
	// Both, for nats.go 1.55's ordered iterator: Stop ends a re-making of the consumer that
	// retries without end (Next's context does not reach it), and Next's context ends a wait
	// on the pull a re-making started just after Stop, which Stop no longer reaches (the
	// gateway's shutdown hung 7 minutes there in CI: TestReadyzWhileIDEMsOnlyReplicaIsDown).
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	b := t.ix.newBatch()
	defer func() { b.discard() }()
	n, seq, wm := 0, uint64(0), time.Time{}
	lastExpiry := time.Now()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		records, err := t.applyOne(b, msg, &wm)
		if err != nil {
			t.cfg.Log.Error().Err(err).Uint64("seq", meta.Sequence.Stream).Msg("cold tier: a message the index cannot apply (skipped)")
		}
		n, seq = n+1+records, meta.Sequence.Stream
		if n < applyBatch && meta.NumPending > 0 {
			continue
		}
		if err := b.commit(seq, wm); err != nil {
			return err
		}
		t.applied.Store(seq)
		if !wm.IsZero() {
			t.watermark.Store(wm.UnixNano())
		}
		b, n, wm = t.ix.newBatch(), 0, time.Time{}
		if now := time.Now(); now.Sub(lastExpiry) >= expireEvery {
			lastExpiry = now
			if end := t.ix.spanAt(now.Add(-t.cfg.TTL)); end != t.expired { // once a span
				if err := t.ix.expire(now, t.cfg.TTL); err != nil {
					return err
				}
				t.expired = end
			}
		}
	}
}

// applyOne adds one OG_COLD message to b: a pack's or a single copy's records (or tombstones)
// as entries, a mark as the watermark the commit will store. n is how many records it held.
func (t *Tier) applyOne(b *batch, msg jetstream.Msg, wm *time.Time) (n int, err error) {
	meta, err := msg.Metadata()
	if err != nil {
		return 0, err
	}
	if msg.Subject() == t.mark {
		var mk mark
		if err := json.Unmarshal(msg.Data(), &mk); err != nil {
			return 0, fmt.Errorf("cold: mark: %w", err)
		}
		*wm = time.Unix(0, mk.W)
		return 0, nil
	}
	records, err := copiedRecords(msg.Headers(), msg.Data())
	if err != nil {
		return 0, err
	}
	for i, r := range records {
		if err := b.put(r.key, entry{seq: meta.Sequence.Stream, rev: r.rev, written: r.written, op: r.op, pos: uint32(i)}); err != nil {
			return i, err
		}
	}
	return len(records), nil
}

// copiedRecords are the records of an OG_COLD copy: a pack's, or the one of a single copy.
func copiedRecords(h nats.Header, data []byte) ([]record, error) {
	if f := h.Get(hdrPack); f != "" {
		if f != packFormat {
			return nil, fmt.Errorf("cold: pack format %q (this version reads %q)", f, packFormat)
		}
		return decodePack(data)
	}
	rev, err := strconv.ParseUint(h.Get(hdrRev), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("cold: revision: %w", err)
	}
	written, err := strconv.ParseInt(h.Get(hdrWritten), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("cold: written: %w", err)
	}
	r := record{key: h.Get(hdrKey), rev: rev, written: time.Unix(0, written), op: opPut, data: data}
	if h.Get(hdrOp) == "del" {
		r.op, r.data = opDel, nil
	}
	return []record{r}, nil
}
