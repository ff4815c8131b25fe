package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/workers"
)

// TestHeldOnACluster (issue 44): on cluster.md's three nodes, the new intents a node admits
// with worker slots free run on that node as held jobs, answered with nothing stored in JOBS
// and nothing delivered by the workers' shared consumer (a queued job costs its write,
// delivery, ack and removal: four replicated writes; a held one's claim is its only stored
// message).
func TestHeldOnACluster(t *testing.T) {
	// Slots enough that none of the 20 finds its node's all taken by executions still writing
	// their outcome (a job is queued then, as it should be).
	gws := embeddedCluster(t, 3, func(cfg *config.Config) { cfg.Workers.Concurrency = 32 })
	for _, gw := range gws {
		testkit.CheckFor(t, time.Minute, 50*time.Millisecond, func() error { return testkit.Ready(gatewaykit.Client(), "http://"+gw.Addr()) })
	}
	js := (&gatewaykit.Gateway{Gateway: gws[0]}).JetStream(t, "held-on-a-cluster")
	ctx := context.Background()
	consumer := func() *jetstream.ConsumerInfo {
		t.Helper()
		c, err := js.Consumer(ctx, jobs.JobsStream, workers.ConsumerName)
		if err != nil {
			t.Fatal(err)
		}
		return c.CachedInfo()
	}
	// A node is ready before its pool runs; each pool holds jobs once it pulls from the consumer.
	testkit.CheckFor(t, time.Minute, 50*time.Millisecond, func() error {
		if w := consumer().NumWaiting; w < len(gws) {
			return fmt.Errorf("%d pulls waiting on the workers' consumer, want one per node (%d)", w, len(gws))
		}
		return nil
	})
	read := func() (stored, delivered uint64) {
		t.Helper()
		st, err := js.Stream(ctx, jobs.JobsStream)
		if err != nil {
			t.Fatal(err)
		}
		// Deliveries, not the last delivered stream sequence: one queued job would count every
		// held job stored before it.
		return st.CachedInfo().State.LastSeq, consumer().Delivered.Consumer
	}
	stored0, delivered0 := read()
	const n = 20
	for i := range n {
		chat(t, "http://"+gws[i%len(gws)].Addr(), fmt.Sprintf("held-on-a-cluster-%02d", i))
	}
	stored, delivered := read()
	if stored != stored0 || delivered != delivered0 {
		t.Fatalf("%d new intents answered: %d jobs stored in JOBS, %d delivered by the workers' consumer; want none of either",
			n, stored-stored0, delivered-delivered0)
	}
}
