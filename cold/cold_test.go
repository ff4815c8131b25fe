package cold_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hot is a test's hot bucket: a KV bucket whose keys expire after ttl.
func hot(t *testing.T, js jetstream.JetStream, ttl time.Duration) jetstream.KeyValue {
	t.Helper()
	kvs, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "IDEM", TTL: ttl, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return kvs
}

// run opens a tier on dir and runs it until the test ends (or stop is called).
func run(t testing.TB, js jetstream.JetStream, dir string, hotTTL time.Duration) (*cold.Tier, func()) {
	t.Helper()
	return runNode(t, js, dir, hotTTL, "")
}

// runNode is run with the mover named node.
func runNode(t testing.TB, js jetstream.JetStream, dir string, hotTTL time.Duration, node string) (*cold.Tier, func()) {
	t.Helper()
	return runTier(t, js, cold.Config{HotTTL: hotTTL, TTL: time.Hour, Source: "KV_IDEM",
		Prefix: "$KV.IDEM.", Dir: dir, MoveAfter: 50 * time.Millisecond, Margin: hotTTL / 2, Every: 20 * time.Millisecond, Node: node})
}

// runTier opens a tier with cfg and runs it until the test ends (or stop is called).
func runTier(t testing.TB, js jetstream.JetStream, cfg cold.Config) (*cold.Tier, func()) {
	t.Helper()
	tier, err := cold.Open(context.Background(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tier.Run(ctx)
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		if err := tier.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stop)
	return tier, stop
}

// holds polls until tier has every key of want with its value (read back from OG_COLD), and
// none of gone.
func holds(t *testing.T, tier *cold.Tier, want map[string][]byte, gone ...string) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		now := time.Now()
		for k, v := range want {
			h, ok, err := tier.Lookup(k, now)
			if err != nil || !ok {
				return fmt.Errorf("%s: not in the cold index (%v)", k, err)
			}
			got, err := tier.Read(context.Background(), k, h)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, v) {
				return fmt.Errorf("%s: read %q, want %q", k, got, v)
			}
		}
		for _, k := range gone {
			if _, ok, _ := tier.Lookup(k, now); ok {
				return fmt.Errorf("%s: still in the cold index", k)
			}
		}
		return nil
	})
}

// TestColdTier: records that left the hot bucket are found in the cold index and read back
// byte-identical (packed, and one copied alone); a delete is carried as a tombstone; the index resumes after a restart, and
// is rebuilt from OG_COLD when its files are deleted or unreadable.
func TestColdTier(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	ctx := context.Background()
	kvs := hot(t, srv.JS, time.Second)
	want := map[string][]byte{}
	for i := range 20 {
		k := fmt.Sprintf("k%02d", i)
		want[k] = []byte(fmt.Sprintf(`{"state":"COMPLETED","n":%d}`+"\nbody", i))
		if _, err := kvs.Put(ctx, k, want[k]); err != nil {
			t.Fatal(err)
		}
	}
	// A record too large to share a pack is copied alone, between packs.
	want["large"] = bytes.Repeat([]byte("large "), 20000)
	if _, err := kvs.Put(ctx, "large", want["large"]); err != nil {
		t.Fatal(err)
	}
	if _, err := kvs.Put(ctx, "k00", []byte("second")); err != nil { // a newer revision wins
		t.Fatal(err)
	}
	want["k00"] = []byte("second")
	if _, err := kvs.Put(ctx, "deleted", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := kvs.Delete(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cold")
	tier, stop := run(t, srv.JS, dir, time.Hour)
	holds(t, tier, want, "deleted", "never")
	if err := tier.Ready(time.Now()); err != nil {
		t.Fatalf("ready after the moves: %v", err)
	}
	// The hot bucket lets them go; the cold tier keeps them.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if _, err := kvs.Get(ctx, "k01"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("k01 still hot (%v)", err)
		}
		return nil
	})
	holds(t, tier, want, "deleted")
	if _, ok, err := tier.Lookup("k01", time.Now().Add(time.Hour+time.Second)); ok || err != nil {
		t.Errorf("k01 past the TTL: found %v (%v), want a miss (a key past its TTL is new)", ok, err)
	}
	stop()

	for _, tc := range []struct {
		name   string
		break_ func() error
	}{
		{"restart", func() error { return nil }},
		{"files deleted", func() error { return os.RemoveAll(dir) }},
		{"files unreadable", func() error {
			files, err := filepath.Glob(filepath.Join(dir, "*"))
			if err != nil {
				return err
			}
			for _, f := range files {
				if err := os.WriteFile(f, []byte("not pebble"), 0o600); err != nil {
					return err
				}
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.break_(); err != nil {
				t.Fatal(err)
			}
			tier, stop := run(t, srv.JS, dir, time.Hour)
			defer stop()
			holds(t, tier, want, "deleted")
		})
	}
}

// TestColdTierBehind: a node whose mover and applier have not covered the hot tier's expiry
// is not ready (its "not found" cannot mean new).
func TestColdTierBehind(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	hot(t, srv.JS, time.Hour)
	tier, err := cold.Open(context.Background(), srv.JS, cold.Config{HotTTL: time.Minute, TTL: time.Hour, Source: "KV_IDEM", Prefix: "$KV.IDEM."})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	if err := tier.Ready(time.Now()); !errors.Is(err, cold.ErrBehind) {
		t.Fatalf("Ready before any mark = %v, want ErrBehind", err)
	}
}

// TestColdTierMoversRace: the movers of three nodes share the rounds over the same hot
// messages: records are stored in OG_COLD about once (not once per mover), every node's
// index holds every key, one node's mover does the rounds while its marks keep coming, and
// when it stops (its node killed during the move) another takes them over: the records
// written after are moved too.
func TestColdTierMoversRace(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	ctx := context.Background()
	kvs := hot(t, srv.JS, time.Hour)
	want := map[string][]byte{}
	put := func(from, to int) {
		for i := from; i < to; i++ {
			k := fmt.Sprintf("race%03d", i)
			want[k] = []byte(k)
			if _, err := kvs.Put(ctx, k, want[k]); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(0, 300)
	time.Sleep(100 * time.Millisecond) // twice the movers' MoveAfter: every record is due
	tiers := map[string]*cold.Tier{}
	stops := map[string]func(){}
	for i := range 3 {
		_, js := srv.Conn(t)
		name := fmt.Sprintf("n%d", i)
		tiers[name], stops[name] = runNode(t, js, "", time.Hour, name)
	}
	for _, tier := range tiers {
		holds(t, tier, want)
	}
	// Movers racing over records from one mark pack them alike (the records are older than
	// every mover's cutoff) and OG_COLD stores each pack once.
	if n, err := tiers["n0"].Records(ctx); err != nil || n != uint64(len(want)) {
		t.Errorf("OG_COLD holds %d copies of %d records (%v)", n, len(want), err)
	}
	var active string
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		nodes := markNodes(t, srv.JS, 10)
		for _, n := range nodes {
			if n != nodes[0] {
				return fmt.Errorf("the last marks come from several movers: %v", nodes)
			}
		}
		active = nodes[0]
		return nil
	})
	stops[active]()
	delete(tiers, active)
	put(300, 400)
	for _, tier := range tiers {
		holds(t, tier, want)
	}
	if nodes := markNodes(t, srv.JS, 1); nodes[0] == active {
		t.Errorf("the last mark is still the stopped mover's (%s)", active)
	}
}

// markNodes names the movers of OG_COLD's last n marks, oldest first.
func markNodes(t *testing.T, js jetstream.JetStream, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, cold.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for seq := info.State.LastSeq; seq > 0 && len(nodes) < n; seq-- {
		m, err := st.GetMsg(ctx, seq)
		if err != nil || m.Subject != "og.cold.mark" {
			continue
		}
		var mk struct{ Node string }
		if err := json.Unmarshal(m.Data, &mk); err != nil {
			t.Fatal(err)
		}
		nodes = append([]string{mk.Node}, nodes...)
	}
	if len(nodes) == 0 {
		t.Fatal("no mark in OG_COLD")
	}
	return nodes
}

// TestColdTierIdleRoundsAskLittle: while the hot records are not due, a mover's rounds do not
// read the hot bucket again (one read of its first message, then the rounds remember it) and
// make no consumer; an idle cluster stays quiet (issue 44).
func TestColdTierIdleRoundsAskLittle(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	kvs := hot(t, srv.JS, time.Hour)
	if _, err := kvs.Put(context.Background(), "fresh", []byte("not due for half an hour")); err != nil {
		t.Fatal(err)
	}
	gets := testkit.Watch(t, srv.NC, "$JS.API.DIRECT.GET.KV_IDEM")
	creates := testkit.Watch(t, srv.NC, "$JS.API.CONSUMER.CREATE.KV_IDEM.>")
	tier, stop := runTier(t, srv.JS, cold.Config{HotTTL: time.Hour, TTL: 2 * time.Hour, Source: "KV_IDEM",
		Prefix: "$KV.IDEM.", Every: 20 * time.Millisecond})
	time.Sleep(time.Second) // about fifty rounds
	stop()
	if n := len(gets); n != 1 {
		t.Errorf("%d direct gets of the hot bucket in about fifty idle rounds, want 1", n)
	}
	if n := len(creates); n != 0 {
		t.Errorf("%d consumers made on the hot bucket with nothing due, want none", n)
	}
	if err := tier.Ready(time.Now()); err != nil {
		t.Errorf("the idle rounds did not move the watermark: %v", err)
	}
}
