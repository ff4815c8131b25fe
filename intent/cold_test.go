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
