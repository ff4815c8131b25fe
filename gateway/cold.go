package gateway

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/kv"
)

// coldLoop is an API node's cold tiers (issue 46), one per partition, and the loop that runs
// them.
type coldLoop struct {
	tiers []*cold.Tier // by partition
	run   *loop
	log   zerolog.Logger
}

// startCold opens and runs a cold tier per partition when idempotency.hot_ttl is below the TTL
// (nil otherwise: today's path, every record hot for the whole TTL). Partition 0's index lives
// in the data directory's cold/, partition k's in p<k>-cold/ (each is rebuilt from its OG_COLD
// when missing). Once a tier has moved every record older than the hot TTL, it lowers its IDEM
// bucket's MaxAge to the hot TTL (a bucket made before had the TTL).
func (g *Gateway) startCold(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*coldLoop, error) {
	idem := g.cfg.Idempotency
	if !idem.ColdTier() {
		return nil, nil
	}
	log = log.With().Str("component", "cold").Logger()
	if !g.res.cold { // a store that kept its keys hot (decided before the setup)
		log.Warn().Dur("hot_ttl", idem.HotTTL.D()).Msg("the cold tier is off: this store has kept every key in IDEM for the TTL (it was made without a cold tier); set idempotency.move_existing to move its records to the cold tier (keys the hot tier lacks are refused until they are moved), or idempotency.hot_ttl to 0 to keep it so")
		return nil, nil
	}
	l := &coldLoop{log: log}
	for _, p := range partition.All(g.res.parts) {
		dir := ""
		if g.cfg.DataDir != "" {
			dir = filepath.Join(g.cfg.DataDir, p.Tagged("cold")) // cold, p1-cold, ...
		}
		source, prefix := kv.BucketNames(p)
		var tier *cold.Tier
		err := openRetried(ctx, log, p.Stream(cold.Stream), clusterSetupWindow, func(ctx context.Context) (err error) {
			tier, err = cold.Open(ctx, js, cold.Config{HotTTL: idem.HotTTL.D(), TTL: idem.TTL.D(), Source: source,
				Prefix: prefix, Replicas: g.res.replicas, Dir: dir, Log: log.With().Int("partition", int(p)).Logger(), Node: g.id,
				Partition: p, Placement: g.res.placement(p)})
			return err
		})
		if err != nil {
			l.close()
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		l.tiers = append(l.tiers, tier)
	}
	l.run = startLoop(ctx, func(ctx context.Context) {
		done := make(chan struct{}, 2*len(l.tiers))
		for p, tier := range l.tiers {
			go func() {
				defer func() { done <- struct{}{} }()
				lowerWhenMoved(ctx, js, tier, partition.P(p), idem.HotTTL.D(), log)
			}()
			go func() {
				defer func() { done <- struct{}{} }()
				tier.Run(ctx)
			}()
		}
		for range 2 * len(l.tiers) {
			<-done
		}
	})
	for _, tier := range l.tiers {
		waitReady(ctx, tier, log)
	}
	return l, nil
}

// keptHot reports whether the store has kept its keys hot so far: partition 0's IDEM bucket
// keeps the TTL (or more) and it has no OG_COLD (a partitioned store's copies were made with
// partition 0's). Turning the cold tier on for such a store is the operator's choice
// (idempotency.move_existing): its backlog is copied first, and new keys are refused
// meanwhile. A read that fails is an error: the setup, which decides it, tries again.
func keptHot(ctx context.Context, js jetstream.JetStream, ttl time.Duration) (bool, error) {
	_, err := js.Stream(ctx, cold.Stream)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, fmt.Errorf("cold tier: %s: %w", cold.Stream, err)
	}
	idem, _ := kv.BucketNames(0)
	st, err := js.Stream(ctx, idem)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil // a new store
	}
	if err != nil {
		return false, fmt.Errorf("cold tier: %s: %w", idem, err)
	}
	return st.CachedInfo().Config.MaxAge >= ttl, nil
}

// coldReadyWait bounds how long a start waits for its cold tier's first mark: until then the
// API answers new keys 503 store_unavailable.
const coldReadyWait = 10 * time.Second

// waitReady waits (at most coldReadyWait) until tier is ready: its first round moves and
// applies at once on a cluster that keeps up.
func waitReady(ctx context.Context, tier *cold.Tier, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, coldReadyWait)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for tier.Ready(time.Now()) != nil {
		select {
		case <-ctx.Done():
			log.Warn().Msg("the cold tier is not ready: new keys are answered 503 until it is")
			return
		case <-tick.C:
		}
	}
}

// lowerWhenMoved lowers partition p's IDEM MaxAge to hot once tier is ready (every record
// older than hot less its margin is in its OG_COLD and applied here).
func lowerWhenMoved(ctx context.Context, js jetstream.JetStream, tier *cold.Tier, p partition.P, hot time.Duration, log zerolog.Logger) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if tier.Ready(time.Now()) == nil {
			if err := kv.LowerToHot(ctx, js, p, hot); err != nil {
				log.Warn().Err(err).Int("partition", int(p)).Msg("lowering the IDEM bucket's MaxAge to the hot TTL")
			} else {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// tierOf is partition p's tier for intent (nil: none).
func (l *coldLoop) tierOf(p partition.P) *cold.Tier {
	if l == nil {
		return nil
	}
	return l.tiers[p]
}

// behind is nil when partition p's tier can tell a new key from a moved one now (cold.Tier.Ready),
// or when p has none.
func (l *coldLoop) behind(p partition.P) error {
	if tier := l.tierOf(p); tier != nil {
		return tier.Ready(time.Now())
	}
	return nil
}

// stop ends the loop and closes the indexes.
func (l *coldLoop) stop() {
	if l == nil {
		return
	}
	l.run.stop()
	l.close()
}

// close closes the indexes: each is a cache of its OG_COLD, a rebuild at most.
func (l *coldLoop) close() {
	for _, tier := range l.tiers {
		if err := tier.Close(); err != nil {
			l.log.Warn().Err(err).Msg("closing the cold index")
		}
	}
}
