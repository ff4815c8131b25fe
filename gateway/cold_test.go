package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/intent"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/kv"
)

// coldConfig gives cfg a cold tier: records leave the hot bucket 4 s after their last write
// (the least hot TTL) and are kept for an hour.
func coldConfig(cfg *config.Config) *config.Config {
	cfg.Idempotency.TTL = config.Duration(time.Hour)
	cfg.Idempotency.HotTTL = config.Duration(4 * time.Second)
	cfg.Idempotency.Lease = config.Duration(2 * time.Second)
	cfg.Idempotency.RenewEvery = config.Duration(500 * time.Millisecond)
	cfg.Idempotency.AutoWindow = config.Duration(time.Second)
	cfg.Idempotency.ReplayCacheBytes = 0 // every replay reads the store
	return cfg
}

// leftHot waits until the hot bucket no longer holds any of keys' records (the record keys
// of the Idempotency-Keys of the anonymous tenant are not known here: the bucket's stream is
// read instead, for a subject of each message it still has).
func leftHot(t *testing.T, js jetstream.JetStream, p partition.P) {
	t.Helper()
	name, _ := kv.BucketNames(p)
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, name)
		if err != nil {
			return err
		}
		if n := st.CachedInfo().State.Msgs; n > 0 {
			return fmt.Errorf("%s still holds %d messages", name, n)
		}
		return nil
	})
}

// executions is what the gateways' mock backends were asked, in all.
func executions(t *testing.T, gws ...*gatewaykit.Gateway) int64 {
	var n int64
	for _, gw := range gws {
		n += gw.Mock(t, "mock").Stats().Requests
	}
	return n
}

// TestColdTierReplays: a record that left the hot tier (idempotency.hot_ttl) is answered from
// the cold tier until the TTL: the same request replays byte-identical (what a replay from the
// hot tier sent, a stream's events too) with no execution; another body with its key is 422;
// the status and job APIs read it. Without the cold tier's admission the retry executes again.
//
// With two partitions each has its own cold tier (OG_COLD_P1 beside OG_COLD): the non-stream
// key is one of partition 0 and the stream key one of partition 1, and both tiers hold copies.
func TestColdTierReplays(t *testing.T) {
	for _, parts := range []int{1, 2} {
		t.Run(fmt.Sprintf("partitions=%d", parts), func(t *testing.T) { coldTierReplays(t, parts) })
	}
}

func coldTierReplays(t *testing.T, parts int) {
	cfg := coldConfig(gatewaykit.Config(t))
	cfg.NATS.Partitions = parts
	gw := gatewaykit.StartGateway(t, cfg)
	js := gw.JetStream(t, "cold-test")
	type sent struct {
		key, body       string
		first, hotAgain answer
	}
	var all []*sent
	for i, stream := range []bool{false, true} {
		extra := ""
		if stream {
			extra = `"stream":true`
		}
		s := &sent{key: keyIn(parts, partition.P(i%parts), fmt.Sprintf("cold-%v", stream)), body: chatBody(config.MockModel, fmt.Sprintf("kept cold %v", stream), extra)}
		s.first = post(t, gw, s.body, key(s.key))
		s.hotAgain = post(t, gw, s.body, key(s.key))
		if s.first.status != http.StatusOK || s.hotAgain.header.Get("Oncegate-Idempotency") != "replayed" {
			t.Fatalf("%s: %d, then %q", s.key, s.first.status, s.hotAgain.header.Get("Oncegate-Idempotency"))
		}
		all = append(all, s)
	}
	// A background job: its id is found through its index entry, which moves to cold too.
	job := post(t, gw, chatBody(config.MockModel, "a cold job", ""), map[string]string{"Idempotency-Key": "cold-job", "Prefer": "respond-async"})
	var accepted struct{ ID string }
	if err := json.Unmarshal(job.body, &accepted); err != nil || job.status != http.StatusAccepted {
		t.Fatalf("background job: %d %s (%v)", job.status, job.body, err)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if a := get(t, gw.URL+"/v1/jobs/"+accepted.ID); !bytes.Contains(a.body, []byte(`"completed"`)) {
			return fmt.Errorf("job: %d %s", a.status, a.body)
		}
		return nil
	})
	before := executions(t, gw)
	for _, p := range partition.All(parts) {
		leftHot(t, js, p)
	}
	if a := get(t, gw.URL+"/v1/jobs/"+accepted.ID); a.status != http.StatusOK || !bytes.Contains(a.body, []byte(`"completed"`)) {
		t.Errorf("job API of a cold job: %d %s, want 200 completed", a.status, a.body)
	}
	for _, s := range all {
		t.Run(s.key, func(t *testing.T) {
			again := post(t, gw, s.body, key(s.key))
			if again.status != http.StatusOK || again.header.Get("Oncegate-Idempotency") != "replayed" {
				t.Fatalf("from the cold tier: %d %q %s, want 200 replayed", again.status, again.header.Get("Oncegate-Idempotency"), again.body)
			}
			if !bytes.Equal(again.body, s.hotAgain.body) {
				t.Errorf("cold replay differs from the hot replay:\ncold: %s\nhot:  %s", again.body, s.hotAgain.body)
			}
			other := post(t, gw, strings.Replace(s.body, "kept", "changed", 1), key(s.key))
			if other.status != http.StatusUnprocessableEntity {
				t.Errorf("another body with a cold key: %d %s, want 422", other.status, other.body)
			}
			st := get(t, gw.URL+"/v1/idempotency/"+s.key)
			if st.status != http.StatusOK || !bytes.Contains(st.body, []byte("completed")) {
				t.Errorf("status API of a cold key: %d %s", st.status, st.body)
			}
		})
	}
	if got := executions(t, gw) - before; got != 0 {
		t.Errorf("%d executions after the records left the hot tier, want 0", got)
	}
	for _, p := range partition.All(parts) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := js.Stream(ctx, p.Stream(cold.Stream))
		cancel()
		if err != nil {
			t.Fatalf("partition %d's cold tier: %v", p, err)
		}
		if n := st.CachedInfo().State.Msgs; n < 2 { // a copy and a mark at least
			t.Errorf("%s holds %d messages: its partition's records were not copied there", p.Stream(cold.Stream), n)
		}
	}
}

// keyIn is an Idempotency-Key of the anonymous tenant whose record is in partition p of parts:
// base, or base with the first suffix that lands there.
func keyIn(parts int, p partition.P, base string) string {
	for i := 0; ; i++ {
		k := base
		if i > 0 {
			k = fmt.Sprintf("%s-%d", base, i)
		}
		if partition.OfKey(intent.RecordKey(parts, "anonymous", k)) == p {
			return k
		}
	}
}

// coldClient is the cold tier tests' one HTTP client (a client per request leaves its
// connections open).
var coldClient = gatewaykit.Client()

// coldPost is a chat request with Idempotency-Key k.
func coldPost(t *testing.T, gw *gatewaykit.Gateway, body, k string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", k)
	resp, err := coldClient.Do(req)
	if err != nil {
		t.Errorf("post: %v", err)
		return answer{}
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b.Bytes()}
}

// coldPostSafe is coldPost sent again, as an SDK would, while the node answers 503
// store_unavailable (for at most 30 s): a node whose cold index is behind the hot tier's
// expiry refuses a key that is not hot rather than call it new (cold.ErrBehind), and every
// node is behind for a moment when the marks pause (CI: a node's restart under load paused
// them past the 3 s this test's hot TTL leaves, and both nodes refused nine keys at once).
func coldPostSafe(t *testing.T, gw *gatewaykit.Gateway, body, k string) answer {
	t.Helper()
	for giveUp := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		a := coldPost(t, gw, body, k)
		if a.status != http.StatusServiceUnavailable || !bytes.Contains(a.body, []byte(`"code":"store_unavailable"`)) || time.Now().After(giveUp) {
			return a
		}
	}
}

// get is a GET of url.
func get(t *testing.T, url string) answer {
	t.Helper()
	resp, err := coldClient.Get(url)
	if err != nil {
		t.Fatalf("get %s: %v", url, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b.Bytes()}
}

// coldNode is a gateway of TestColdTierCluster that the test may stop before its end.
type coldNode struct {
	*gatewaykit.Gateway
	stop func()
}

// startColdNode starts a gateway with cfg, stopped at stop or when the test ends.
func startColdNode(t *testing.T, cfg *config.Config) *coldNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := gateway.Start(ctx, cfg, zerolog.New(io.Discard), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	n := &coldNode{Gateway: &gatewaykit.Gateway{Gateway: gw, URL: "http://" + gw.Addr(), Cfg: cfg}}
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := gw.Stop(ctx); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
	}
	t.Cleanup(n.stop)
	return n
}

// TestColdTierCluster is issue 46's fault rows on a three-server cluster (R3, a gateway on
// each server, records hot for 4 s):
//   - the same key sent to two nodes at once, over and over, while its record crosses from the
//     hot tier to the cold one: every answer is its replay, one execution in all;
//   - a node stopped while the records are being moved: the others' movers finish the move,
//     and every key replays from the cold tier;
//   - a node whose local cold files were deleted while it was down rebuilds them from OG_COLD
//     and replays every key, nothing executed again.
func TestColdTierCluster(t *testing.T) {
	c := testkit.RunCluster(t, 3)
	nodes := make([]*coldNode, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		cfg := coldConfig(gatewaykit.Config(t))
		cfg.NATS.URL = c.URLs()[i]
		cfg.NATS.Replicas = 3
		cfg.Workers.Concurrency = 4
		wg.Go(func() { nodes[i] = startColdNode(t, cfg) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	gws := func() []*gatewaykit.Gateway {
		var out []*gatewaykit.Gateway
		for _, n := range nodes {
			out = append(out, n.Gateway)
		}
		return out
	}
	_, js := c.ConnectTo(t, 0)

	const n = 20
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = chatBody(config.MockModel, fmt.Sprintf("moved on a cluster %d", i), "")
		if a := post(t, nodes[i%3].Gateway, bodies[i], key(fmt.Sprintf("cluster-%d", i))); a.status != http.StatusOK {
			t.Fatalf("key %d: %d %s", i, a.status, a.body)
		}
	}
	created := executions(t, gws()...)
	if created != n {
		t.Fatalf("%d executions for %d keys", created, n)
	}
	stopped := executions(t, nodes[2].Gateway) // a stopped node's mock counts no more
	nodes[2].stop()                            // node 3 stops while the records are hot (its mover among the three)

	// Key 0 on nodes 1 and 2 together, until its record has left the hot tier and a few more.
	boundary := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, kv.BucketStream)
		if err != nil {
			return err
		}
		if st.CachedInfo().State.Msgs > 0 {
			return fmt.Errorf("still hot: %+v", st.CachedInfo().State)
		}
		return nil
	}
	after, giveUp, nextCheck := 0, time.Now().Add(time.Minute), time.Time{}
	for round := 0; after < 5; round++ {
		if now := time.Now(); now.After(nextCheck) { // a STREAM.INFO per round held the expiry back
			nextCheck = now.Add(250 * time.Millisecond)
			if boundary() == nil {
				after++
			}
		}
		var answers [2]answer
		var wg sync.WaitGroup
		for j := range answers {
			wg.Go(func() { answers[j] = coldPost(t, nodes[j].Gateway, bodies[0], "cluster-0") })
		}
		wg.Wait()
		for j, a := range answers {
			if a.status != http.StatusOK || a.header.Get("Oncegate-Idempotency") != "replayed" {
				t.Fatalf("round %d, node %d: %d %q %s, want 200 replayed", round, j+1, a.status, a.header.Get("Oncegate-Idempotency"), a.body)
			}
		}
		if time.Now().After(giveUp) {
			t.Fatalf("the record never left the hot tier: %v", boundary())
		}
	}
	leftHot(t, js, 0)

	// Node 2 goes down, loses its cold index, and comes back.
	dataDir := nodes[1].Cfg.DataDir
	stopped += executions(t, nodes[1].Gateway)
	nodes[1].stop()
	if err := os.RemoveAll(filepath.Join(dataDir, "cold")); err != nil {
		t.Fatal(err)
	}
	cfg := coldConfig(gatewaykit.Config(t))
	cfg.DataDir, cfg.NATS.URL, cfg.NATS.Replicas, cfg.Workers.Concurrency = dataDir, c.URLs()[1], 3, 4
	nodes[1] = startColdNode(t, cfg)
	for i := range bodies {
		for _, j := range []int{0, 1} {
			a := coldPostSafe(t, nodes[j].Gateway, bodies[i], fmt.Sprintf("cluster-%d", i))
			if a.status != http.StatusOK || a.header.Get("Oncegate-Idempotency") != "replayed" {
				t.Errorf("key %d on node %d: %d %q %s, want 200 replayed from the cold tier", i, j+1, a.status, a.header.Get("Oncegate-Idempotency"), a.body)
			}
		}
	}
	if got := executions(t, nodes[0].Gateway, nodes[1].Gateway) + stopped; got != created { // nodes[1] is the new one
		t.Errorf("%d executions, want %d: a key was executed again", got, created)
	}
}

// TestColdTierKeepsAHotStoreHot: a hot TTL (the default's 15 minutes, or any) does not turn the
// cold tier on for a store that has kept every key hot (made without a cold tier): its IDEM
// bucket keeps the TTL, no OG_COLD is made, and a key stays hot past the hot TTL. With
// idempotency.move_existing the cold tier starts: OG_COLD is made, the bucket is lowered to
// the hot TTL once its records are moved, and the key is then replayed from the cold tier.
func TestColdTierKeepsAHotStoreHot(t *testing.T) {
	dataDir := t.TempDir() // one store, through three gateways in turn
	base := func() *config.Config {
		cfg := coldConfig(gatewaykit.Config(t))
		cfg.DataDir = dataDir
		return cfg
	}
	maxAge := func(js jetstream.JetStream) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, kv.BucketStream)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config.MaxAge
	}
	coldExists := func(js jetstream.JetStream) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.Stream(ctx, cold.Stream)
		return err == nil
	}
	run := func(cfg *config.Config, f func(gw *gatewaykit.Gateway, js jetstream.JetStream)) {
		t.Helper()
		n := startColdNode(t, cfg)
		nc, err := n.Connect("cold-test")
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		f(n.Gateway, js)
		nc.Close()
		n.stop()
	}
	body := chatBody(config.MockModel, "made before the cold tier", "")
	var first answer
	hot := base()
	hot.Idempotency.HotTTL = 0
	run(hot, func(gw *gatewaykit.Gateway, _ jetstream.JetStream) { // the store as a gateway without a cold tier made it
		first = post(t, gw, body, key("kept-hot"))
	})
	run(base(), func(gw *gatewaykit.Gateway, js jetstream.JetStream) {
		if got := maxAge(js); got != time.Hour {
			t.Errorf("IDEM's MaxAge %s with a hot TTL on a hot store, want the TTL (1h)", got)
		}
		if coldExists(js) {
			t.Errorf("%s was made on a store that keeps its keys hot", cold.Stream)
		}
		time.Sleep(5 * time.Second) // past the hot TTL: the bucket still keeps the key
		if a := post(t, gw, body, key("kept-hot")); a.header.Get("Oncegate-Idempotency") != "replayed" || !bytes.Equal(a.body, first.body) {
			t.Errorf("the key past the hot TTL: %d %q, want replayed", a.status, a.header.Get("Oncegate-Idempotency"))
		}
	})
	moving := base()
	moving.Idempotency.MoveExisting = true
	run(moving, func(gw *gatewaykit.Gateway, js jetstream.JetStream) {
		if !coldExists(js) {
			t.Errorf("no %s with move_existing", cold.Stream)
		}
		testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			if got := maxAge(js); got != 4*time.Second {
				return fmt.Errorf("IDEM's MaxAge is %s, want the hot TTL once the records are moved", got)
			}
			return nil
		})
		leftHot(t, js, 0)
		if a := post(t, gw, body, key("kept-hot")); a.header.Get("Oncegate-Idempotency") != "replayed" || !bytes.Equal(a.body, first.body) {
			t.Errorf("the key from the cold tier: %d %q, want replayed", a.status, a.header.Get("Oncegate-Idempotency"))
		}
	})
}

// TestReadyzWhileTheColdTierIsBehind: while a node's cold tier cannot tell a new key from one
// that left the hot tier (no mark applied up to the hot tier's expiry: at a fresh cluster's
// start, or with no mover at work), the node answers every new key 503 store_unavailable, and
// /readyz says so too instead of 200 (a load balancer would send it requests it refuses: seen
// in bench/cluster-cost.sh, 10 s of 503s after /readyz said 200). The movers are stopped by
// sealing OG_COLD, which refuses their marks.
func TestReadyzWhileTheColdTierIsBehind(t *testing.T) {
	gw := gatewaykit.StartGateway(t, coldConfig(gatewaykit.Config(t)))
	js := gw.JetStream(t, "cold-readyz-test")
	testkit.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error { return testkit.Ready(gatewaykit.Client(), gw.URL) })
	if a := post(t, gw, chatBody(config.MockModel, "before", ""), key("cold-readyz-before")); a.status != http.StatusOK {
		t.Fatalf("a new key with the cold tier at work: %d %s, want 200", a.status, a.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, cold.Stream)
	if err != nil {
		t.Fatal(err)
	}
	sealed := st.CachedInfo().Config
	sealed.Sealed = true
	if _, err := js.UpdateStream(ctx, sealed); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
		if a := get(t, gw.URL+"/readyz"); a.status != http.StatusServiceUnavailable || !bytes.Contains(a.body, []byte("cold")) {
			return fmt.Errorf("/readyz: %d %s, want 503 naming the cold tier", a.status, a.body)
		}
		return nil
	})
	a := post(t, gw, chatBody(config.MockModel, "after", ""), key("cold-readyz-after"))
	if a.status != http.StatusServiceUnavailable || !bytes.Contains(a.body, []byte("store_unavailable")) {
		t.Errorf("a new key while /readyz says the cold tier is behind: %d %s, want 503 store_unavailable", a.status, a.body)
	}
}
