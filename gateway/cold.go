package gateway

import (
	"context"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/kv"
)

// coldLoop is an API node's cold tier (issue 46) and the loop that runs it.
type coldLoop struct {
	tier *cold.Tier
	run  *loop
	log  zerolog.Logger
}

// startCold opens and runs the cold tier when idempotency.hot_ttl is below the TTL (nil
// otherwise: today's path, every record hot for the whole TTL). Its index lives in the data
// directory's cold/ (it is rebuilt from OG_COLD when missing). Once it has moved every record
// older than the hot TTL, it lowers the IDEM bucket's MaxAge to the hot TTL (a bucket made
// before had the TTL).
func (g *Gateway) startCold(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*coldLoop, error) {
	idem := g.cfg.Idempotency
	if !idem.ColdTier() {
		return nil, nil
	}
	dir := ""
	if g.cfg.DataDir != "" {
		dir = filepath.Join(g.cfg.DataDir, "cold")
	}
	log = log.With().Str("component", "cold").Logger()
	tier, err := cold.Open(ctx, js, cold.Config{HotTTL: idem.HotTTL.D(), TTL: idem.TTL.D(), Source: kv.BucketStream,
		Prefix: "$KV." + kv.Bucket + ".", Replicas: g.res.replicas, Dir: dir, Log: log, Node: g.id})
	if err != nil {
		return nil, err
	}
	l := &coldLoop{tier: tier, log: log}
	l.run = startLoop(ctx, func(ctx context.Context) {
		lowered := make(chan struct{})
		go func() {
			defer close(lowered)
			lowerWhenMoved(ctx, js, tier, idem.HotTTL.D(), log)
		}()
		tier.Run(ctx)
		<-lowered
	})
	waitReady(ctx, tier, log)
	return l, nil
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

// lowerWhenMoved lowers IDEM's MaxAge to hot once tier is ready (every record older than hot
// less its margin is in OG_COLD and applied here).
func lowerWhenMoved(ctx context.Context, js jetstream.JetStream, tier *cold.Tier, hot time.Duration, log zerolog.Logger) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if tier.Ready(time.Now()) == nil {
			if err := kv.LowerToHot(ctx, js, hot); err != nil {
				log.Warn().Err(err).Msg("lowering the IDEM bucket's MaxAge to the hot TTL")
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

// tierOf is the tier for intent (nil: none).
func (l *coldLoop) tierOf() intent.ColdTier {
	if l == nil {
		return nil
	}
	return l.tier
}

// stop ends the loop and closes the index.
func (l *coldLoop) stop() {
	if l == nil {
		return
	}
	l.run.stop()
	if err := l.tier.Close(); err != nil { // the index is a cache of OG_COLD: a rebuild at most
		l.log.Warn().Err(err).Msg("closing the cold index")
	}
}
