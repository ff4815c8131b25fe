package intent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/kv"
)

// TestColdTierBehindRefuses is issue 46's row "a node whose cold tier lags refuses and never
// re-executes": a node whose cold index has not applied the cold tier up to the hot tier's
// expiry (here: its tier never ran) answers a key the hot tier does not hold with
// store_unavailable (kv.ErrUnavailable, a 503) and writes nothing, not "new"; a key the hot
// tier holds it still serves.
func TestColdTierBehindRefuses(t *testing.T) {
	e := newEnv(t, nil)
	tier, err := cold.Open(context.Background(), e.srv.JS, cold.Config{HotTTL: time.Minute, TTL: recordTTL,
		Source: kv.BucketStream, Prefix: "$KV." + kv.Bucket + ".", Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	behind := e.otherNode(t, func(d *intent.Deps) { d.Cold = tier })

	hot := request("hot")
	admit(t, e.core, hot)
	e.finish(t, hot.Key, kv.Completed, kv.Result{Status: 200, Body: []byte(`{"ok":true}`)})
	e.records.count(t, "")
	e.jobs.count(t, "")

	t.Run("a key the hot tier holds", func(t *testing.T) {
		if adm := admit(t, behind, hot); adm.Outcome != intent.Replayed {
			t.Errorf("outcome %v, want replayed", adm.Outcome)
		}
	})
	t.Run("a key it does not", func(t *testing.T) {
		_, err := behind.Admit(context.Background(), request("maybe-cold"))
		if !errors.Is(err, cold.ErrBehind) || !errors.Is(err, kv.ErrUnavailable) {
			t.Fatalf("admit: %v, want cold.ErrBehind (kv.ErrUnavailable: 503 store_unavailable)", err)
		}
	})
	if n := e.records.count(t, ""); n != 0 {
		t.Errorf("%d record writes, want 0", n)
	}
	if n := e.jobs.count(t, ""); n != 0 {
		t.Errorf("%d jobs published, want 0", n)
	}
}

// TestColdTierNewKeyCostsNoRequest: with a cold tier that is ready, admitting a new key makes
// the JetStream API requests it makes without one (none: the claim and the job are publishes),
// since the cold index answers locally. (A record read on that path would count 2: a direct
// get and, on its miss, the leader's.)
func TestColdTierNewKeyCostsNoRequest(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	tier, err := cold.Open(ctx, e.srv.JS, cold.Config{HotTTL: time.Minute, TTL: recordTTL,
		Source: kv.BucketStream, Prefix: "$KV." + kv.Bucket + ".", Every: 10 * time.Millisecond, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tier.Run(ctx)
	}()
	t.Cleanup(func() { _ = tier.Close() })
	for tier.Ready(time.Now()) != nil {
		time.Sleep(10 * time.Millisecond) // polls for the first mark; no timing is asserted
	}
	// The mover and applier stop (their requests are not admission's); the index stays ready
	// for a quarter of the hot TTL.
	cancel()
	<-done
	withCold := e.otherNode(t, func(d *intent.Deps) { d.Cold = tier })
	api := e.spy(t, "$JS.API.>")
	for _, tc := range []struct {
		name string
		core *intent.Core
	}{{"without a cold tier", e.core}, {"with a cold tier", withCold}} {
		t.Run(tc.name, func(t *testing.T) {
			api.count(t, "")
			if adm := admit(t, tc.core, request("new "+tc.name)); adm.Outcome != intent.Created {
				t.Fatalf("outcome %v, want created", adm.Outcome)
			}
			if n := api.count(t, ""); n != 0 {
				t.Errorf("%d JetStream API requests for a new key, want 0", n)
			}
		})
	}
}
