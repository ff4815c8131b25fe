package testkit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestClusterSurvivesItsStreamLeader proves what issue 12's fault suite builds on: an R3 KV
// bucket on RunCluster(t, 3) keeps its data and takes writes after its stream leader's server
// stops, and the stopped server, restarted on its ports and store directory, catches up.
func TestClusterSurvivesItsStreamLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("a leader election takes seconds")
	}
	c := testkit.RunCluster(t, 3)
	_, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const bucket, stream = "ONCE", "KV_ONCE"
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Replicas: 3, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatalf("create R3 bucket: %v", err)
	}
	if _, err := kv.Put(ctx, "before", []byte("1")); err != nil {
		t.Fatalf("put before the stop: %v", err)
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error { return c.StreamCurrent(stream) })

	old := c.StreamLeader(stream)
	if old < 0 {
		t.Fatal("the bucket's stream has no leader")
	}
	c.Stop(old)

	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		switch l := c.StreamLeader(stream); {
		case l < 0:
			return errors.New("no new stream leader yet")
		case l == old:
			return fmt.Errorf("server %d still leads", l) // cannot happen while stopped
		}
		return nil
	})
	// The client may still be reconnecting, and the new leader may need a moment to take
	// writes: retry the put until it is acknowledged.
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := kv.Put(pctx, "after", []byte("2"))
		return err
	})
	for key, want := range map[string]string{"before": "1", "after": "2"} {
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatalf("get %s with a server down: %v", key, err)
		}
		if got := string(e.Value()); got != want {
			t.Errorf("get %s = %q, want %q", key, got, want)
		}
	}

	c.Restart(old)
	c.WaitFormed()
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error { return c.StreamCurrent(stream) })
	if c.Server(old) == nil {
		t.Fatal("restarted server reads as stopped")
	}
}

// TestClusterStockLimits proves StockLimits keeps nats-server's default consumer cap per
// stream (1,000), as each server reports its JetStream limits, also after a restart, and
// that RunCluster without it lifts the cap (-1), as the embedded server does.
func TestClusterStockLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters")
	}
	check := func(c *testkit.Cluster, want int) {
		t.Helper()
		for i := range c.Size() {
			info, err := c.Server(i).Jsz(nil)
			if err != nil {
				t.Fatalf("server %d: jsz: %v", i, err)
			}
			if info.Limits == nil || info.Limits.DefaultMaxConsumers != want {
				t.Errorf("server %d reports JetStream limits %+v, want default max consumers %d", i, info.Limits, want)
			}
		}
	}
	stock := testkit.RunCluster(t, 3, testkit.StockLimits())
	check(stock, server.JSDefaultMaxConsumersPerStream)
	stock.Stop(1)
	stock.Restart(1)
	check(stock, server.JSDefaultMaxConsumersPerStream)
	check(testkit.RunCluster(t, 3), -1)
}
