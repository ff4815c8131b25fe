package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/workers"
)

// TestHeldOnACluster (issue 44): on cluster.md's three nodes, the new intents a node admits
// with worker slots free run on that node as held jobs: each is stored in JOBS, and the
// workers' shared consumer delivers none of them (a queued job costs its delivery, ack and
// removal: three replicated writes).
func TestHeldOnACluster(t *testing.T) {
	gws := embeddedCluster(t, 3, nil)
	for _, gw := range gws {
		testkit.CheckFor(t, time.Minute, 50*time.Millisecond, func() error { return testkit.Ready(gatewaykit.Client(), "http://"+gw.Addr()) })
	}
	js := (&gatewaykit.Gateway{Gateway: gws[0]}).JetStream(t, "held-on-a-cluster")
	ctx := context.Background()
	read := func() (stored, delivered uint64) {
		t.Helper()
		st, err := js.Stream(ctx, jobs.JobsStream)
		if err != nil {
			t.Fatal(err)
		}
		c, err := js.Consumer(ctx, jobs.JobsStream, workers.ConsumerName)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.LastSeq, c.CachedInfo().Delivered.Stream
	}
	stored0, delivered0 := read()
	const n = 20
	for i := range n {
		chat(t, "http://"+gws[i%len(gws)].Addr(), fmt.Sprintf("held-on-a-cluster-%02d", i))
	}
	stored, delivered := read()
	if stored-stored0 != n || delivered != delivered0 {
		t.Fatalf("%d new intents: %d jobs stored in JOBS, %d delivered by the workers' consumer; want %d stored, none delivered",
			n, stored-stored0, delivered-delivered0, n)
	}
}
