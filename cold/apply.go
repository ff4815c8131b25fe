package cold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// applyBatch bounds the OG_COLD messages one index commit holds.
const applyBatch = 1024

// expireEvery is how often the index drops the hours past the TTL.
const expireEvery = time.Minute

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
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("cold: consume: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	b := t.ix.newBatch()
	defer func() { b.discard() }()
	n, seq, wm := 0, uint64(0), time.Time{}
	lastExpiry := time.Now()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		if err := t.applyOne(b, msg, &wm); err != nil {
			t.cfg.Log.Error().Err(err).Uint64("seq", meta.Sequence.Stream).Msg("cold tier: a message the index cannot apply (skipped)")
		}
		n, seq = n+1, meta.Sequence.Stream
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
			if end := unixHour(now.Add(-t.cfg.TTL)); end != t.expired { // once an hour
				if err := t.ix.expire(now, t.cfg.TTL); err != nil {
					return err
				}
				t.expired = end
			}
		}
	}
}

// applyOne adds one OG_COLD message to b: a record's copy (or tombstone) as an entry, a mark
// as the watermark the commit will store.
func (t *Tier) applyOne(b *batch, msg jetstream.Msg, wm *time.Time) error {
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	if msg.Subject() == t.mark {
		var mk mark
		if err := json.Unmarshal(msg.Data(), &mk); err != nil {
			return fmt.Errorf("cold: mark: %w", err)
		}
		*wm = time.Unix(0, mk.W)
		return nil
	}
	h := msg.Headers()
	rev, err := strconv.ParseUint(h.Get(hdrRev), 10, 64)
	if err != nil {
		return fmt.Errorf("cold: revision: %w", err)
	}
	written, err := strconv.ParseInt(h.Get(hdrWritten), 10, 64)
	if err != nil {
		return fmt.Errorf("cold: written: %w", err)
	}
	e := entry{seq: meta.Sequence.Stream, rev: rev, written: time.Unix(0, written), op: opPut}
	if h.Get(hdrOp) == "del" {
		e.op = opDel
	}
	return b.put(h.Get(hdrKey), e)
}
