package gateway

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/resilience"
)

// openRetried calls open until it succeeds, fails with an error a retry cannot cure, or
// window has passed. The API's start opens what the setup (ensureResourcesRetried) made
// (the effects bucket, the API keys bucket, each partition's cold tier), and on a loaded or
// settling cluster one of those requests can go unanswered in time as the setup's can: a node
// restarted after a kill under load exited with "effects: open bucket OG_EFFECTS: replicas:
// stream KV_OG_EFFECTS: context deadline exceeded" (TestDeployedRow, seen once).
func openRetried(ctx context.Context, log zerolog.Logger, what string, window time.Duration, open func(context.Context) error) error {
	deadline := time.Now().Add(window)
	for {
		err := open(ctx)
		if err == nil || !jsretry.Transient(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		log.Info().Err(err).Str("opening", what).Msg("JetStream did not answer in time while the API starts: retrying")
		// As the setup waits: two nodes creating the same new stream at once both go
		// unanswered (nats-server 2.15), and a random wait of up to a second puts one ahead.
		t := time.NewTimer(resilience.Backoff(0, setupJitter, setupJitter))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
