package retention

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"github.com/rs/zerolog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	keys        = flag.Int("retention.keys", 0, "completed keys to write and keep (issue 36 measures 1,000,000); 0 skips TestRetention")
	heapProfile = flag.String("retention.heapprofile", "", "write a heap profile here after the settle, while the keys are retained (go tool pprof -sample_index=inuse_space)")
	writers     = flag.Int("retention.writers", 64, "keys written at once")
	rate        = flag.Int("retention.rate", 0, "keys written per second at most (0: as fast as the writers go); a gateway's own rate is 1,000-2,000 new intents/s per node")
	settle      = flag.Duration("retention.settle", 30*time.Second, "wait after the writes before measuring, so the server's caches of just-written blocks expire")
	hotTTL      = flag.Duration("retention.hot", 0, "TestRetention: keep the keys in the IDEM bucket this long (idempotency.hot_ttl) and the rest of the day in the cold tier (issue 46); the measurement waits until every key has left the hot tier. 0: every key hot for the TTL")
	crashDir    = flag.String("retention.crashdir", "", "TestCrashImage: the gateway data directory to write -retention.keys keys into before the process SIGKILLs itself (bench/crash-restart.sh)")
)

// benchTenant owns TestRetention's keys; crashTenant owns TestCrashImage's, the tenant of a
// gateway without tenants, so that its status API reads them after the restart.
const (
	benchTenant = "bench"
	crashTenant = "anonymous"
)

// warmKeys are written before the first measurement, so that the bucket, its first blocks and
// the connection's buffers are not counted as the keys' cost.
const warmKeys = 10_000

// TestRetention writes -retention.keys completed records into an IDEM bucket on an embedded
// server (sync 1 s, as bench/oncegate-1s.yaml) after warmKeys, measures the process's memory
// before and, once the caches of the blocks just written have expired, after (RSS, and the Go
// heap in use, after a collection), logs the growth per key,
// and replays the oldest and the newest measured key: each must read back exactly as written.
func TestRetention(t *testing.T) {
	if *keys <= 0 {
		t.Skip("set -retention.keys N to measure (issue 36: 1,000,000)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	s := testkit.RunJetStream(t, time.Second)
	st, err := kv.Open(ctx, s.JS, kv.BucketConfig{TTL: 24 * time.Hour, HotTTL: *hotTTL})
	if err != nil {
		t.Fatal(err)
	}
	var tier *cold.Tier
	if *hotTTL > 0 {
		tier = runCold(ctx, t, s.JS, *hotTTL)
	}
	if err := write(ctx, st, benchTenant, 0, warmKeys); err != nil {
		t.Fatal(err)
	}
	if tier != nil {
		leftHot(ctx, t, s.JS, tier)
	}
	before := measure()
	start := time.Now()
	if err := write(ctx, st, benchTenant, warmKeys, warmKeys+*keys); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	written := measure()
	if tier != nil {
		leftHot(ctx, t, s.JS, tier)
		t.Logf("every key left the hot tier %s after the last write", time.Since(start.Add(took)).Round(time.Second))
		lost, err := uncopied(tier, benchTenant, 0, warmKeys+*keys)
		if err != nil {
			t.Fatal(err)
		}
		if lost > 0 {
			t.Fatalf("%d of %d keys are in neither tier: the mover fell behind and their records expired uncopied", lost, warmKeys+*keys)
		}
		t.Logf("every one of the %d keys is in the cold index", warmKeys+*keys)
	}
	time.Sleep(*settle)
	after := measure()
	if *heapProfile != "" {
		writeHeapProfile(t, *heapProfile)
	}
	n := float64(*keys)
	t.Logf("%d keys written in %s (%.0f/s, %d at once)", *keys, took.Round(time.Millisecond), n/took.Seconds(), *writers)
	t.Logf("before: %s", before)
	t.Logf("right after the writes: %s", written)
	t.Logf("after %s: %s", *settle, after)
	t.Logf("per retained key: RSS %+.0f B, Go heap in use %+.0f B (the embedded server's indexes and the client's, in one process)",
		float64(after.rss-before.rss)/n, float64(after.heap-before.heap)/n)
	for _, i := range []int{warmKeys, warmKeys + *keys - 1} {
		rec, err := replay(ctx, st, tier, keyOf(benchTenant, i))
		if err != nil {
			t.Fatalf("replay of key %d: %v", i, err)
		}
		if rec.State != kv.Completed || rec.Result == nil || !bytes.Equal(rec.Result.Body, body(i)) {
			t.Fatalf("replay of key %d: state %s, body %q; want the completed body written", i, rec.State, resultBody(rec))
		}
	}
}

// runCold runs a cold tier beside the bucket (its index in a temporary directory) until the
// test ends.
func runCold(ctx context.Context, t *testing.T, js jetstream.JetStream, hot time.Duration) *cold.Tier {
	return runColdIn(ctx, t, js, hot, filepath.Join(t.TempDir(), "cold"))
}

// runColdIn is runCold with the index in dir.
func runColdIn(ctx context.Context, t *testing.T, js jetstream.JetStream, hot time.Duration, dir string) *cold.Tier {
	tier, err := cold.Open(ctx, js, cold.Config{HotTTL: hot, TTL: 24 * time.Hour, Source: kv.BucketStream,
		Prefix: "$KV." + kv.Bucket + ".", Dir: dir, Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tier.Run(rctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = tier.Close()
	})
	return tier
}

// leftHot waits until the bucket holds no key (each expired from the hot tier) and the cold
// index is ready.
func leftHot(ctx context.Context, t *testing.T, js jetstream.JetStream, tier *cold.Tier) {
	t.Helper()
	testkit.CheckFor(t, 2*time.Hour, time.Second, func() error {
		s, err := js.Stream(ctx, kv.BucketStream)
		if err != nil {
			return err
		}
		if n := s.CachedInfo().State.Msgs; n > 0 {
			return fmt.Errorf("%d keys still hot", n)
		}
		return tier.Ready(time.Now())
	})
}

// uncopied counts tenant's keys from..to-1 that the cold index does not hold (once every key
// has left the hot tier: their records expired uncopied).
func uncopied(tier *cold.Tier, tenant string, from, to int) (int, error) {
	now, lost := time.Now(), 0
	for i := from; i < to; i++ {
		_, ok, err := tier.Lookup(keyOf(tenant, i), now)
		if err != nil {
			return 0, err
		}
		if !ok {
			lost++
		}
	}
	return lost, nil
}

// replay reads key's record as admission would: from the bucket, else from the cold tier.
func replay(ctx context.Context, st *kv.Store, tier *cold.Tier, key string) (*kv.Record, error) {
	if tier == nil {
		rec, _, err := st.Get(ctx, key)
		return rec, err
	}
	h, ok, err := tier.Lookup(key, time.Now())
	if err != nil || !ok {
		return nil, fmt.Errorf("not in the cold tier (%v)", err)
	}
	data, err := tier.Read(ctx, key, h)
	if err != nil {
		return nil, err
	}
	return kv.Decode(data)
}

// TestCrashImage leaves a crashed gateway's store behind: -retention.keys completed keys written
// the gateway's way into -retention.crashdir (the gateway's data-dir layout, synced every second
// as with nats.sync 1s), then, once a sync has passed, the process SIGKILLs itself, so the
// embedded server writes no index on the way out (above a million keys it keeps none current:
// the restart rebuilds KV_IDEM from its blocks). bench/crash-restart.sh runs it, then times
// `oncegate serve` on the directory until /readyz answers 200 and reads the oldest key (issue 43
// item 0). It always ends killed; it never passes.
func TestCrashImage(t *testing.T) {
	if *crashDir == "" || *keys <= 0 {
		t.Skip("set -retention.crashdir DIR and -retention.keys N (bench/crash-restart.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	ns, err := natsrv.Start(ctx, natsrv.Options{StoreDir: filepath.Join(*crashDir, "jetstream"), SyncInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ns.Connect("crash-image")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Open(ctx, js, kv.BucketConfig{TTL: 24 * time.Hour, HotTTL: *hotTTL})
	if err != nil {
		t.Fatal(err)
	}
	var tier *cold.Tier
	if *hotTTL > 0 { // the gateway's layout: its cold index in the data directory's cold/
		tier = runColdIn(ctx, t, js, *hotTTL, filepath.Join(*crashDir, "cold"))
	}
	before := measure()
	start := time.Now()
	if err := write(ctx, st, crashTenant, 0, *keys); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%d keys written in %s (%.0f/s)\n", *keys, time.Since(start).Round(time.Millisecond), float64(*keys)/time.Since(start).Seconds())
	if tier != nil {
		leftHot(ctx, t, js, tier)
		lost, err := uncopied(tier, crashTenant, 0, *keys)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("every key left the hot tier %s after the first write; the cold index holds %d of the %d keys\n", time.Since(start).Round(time.Second), *keys-lost, *keys)
		if lost > 0 {
			fmt.Printf("MOVER BEHIND: %d of %d keys' records expired uncopied\n", lost, *keys)
		}
		// The image is also TestRetention's measurement, in one write of the keys: the
		// process's memory growth per retained key once every key is cold (-retention.settle).
		time.Sleep(*settle)
		after := measure()
		if *heapProfile != "" {
			writeHeapProfile(t, *heapProfile)
		}
		fmt.Printf("before: %s\nafter %s: %s\n", before, *settle, after)
		fmt.Printf("per retained key: RSS %+.0f B, Go heap in use %+.0f B\n",
			float64(after.rss-before.rss)/float64(*keys), float64(after.heap-before.heap)/float64(*keys))
		for _, i := range []int{0, *keys - 1} {
			rec, err := replay(ctx, st, tier, keyOf(crashTenant, i))
			if err != nil || rec.State != kv.Completed || rec.Result == nil || !bytes.Equal(rec.Result.Body, body(i)) {
				fmt.Printf("REPLAY FAILED: key %d: %v\n", i, err)
				continue
			}
			fmt.Printf("key %d replays from the cold tier as written\n", i)
		}
	}
	time.Sleep(2 * time.Second) // past a sync: what was acknowledged is on disk
	fmt.Println("SIGKILL")
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal ends the process
}

// writeHeapProfile writes the heap's live allocations to path: where the retained keys' memory is.
func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path) // #nosec G304 -- the path the operator passed
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}

// usage is the process's memory at one moment: RSS, the Go heap in use, and the runtime's
// memory outside the heap that a burst leaves behind (span and GC metadata, stacks, other).
type usage struct{ rss, heap, runtime int64 }

func (u usage) String() string {
	return fmt.Sprintf("RSS %.1f MiB, Go heap in use %.1f MiB, runtime metadata and stacks %.1f MiB",
		float64(u.rss)/(1<<20), float64(u.heap)/(1<<20), float64(u.runtime)/(1<<20))
}

// measure collects (twice, so that finalizers' frees are counted), returns freed pages to the
// OS, then reads the RSS and the heap in use.
func measure() usage {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{rss: rss(), heap: int64(ms.HeapInuse),
		runtime: int64(ms.MSpanSys + ms.MCacheSys + ms.BuckHashSys + ms.GCSys + ms.OtherSys + ms.StackSys)}
}

// rss is the process's resident set from /proc (0 where there is none).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// write claims and completes keys [from, to), *writers at a time, as the gateway does: a
// PENDING claim carrying the request, then the COMPLETED record carrying the answer.
func write(ctx context.Context, st *kv.Store, tenant string, from, to int) error {
	var next atomic.Int64
	next.Store(int64(from))
	start := time.Now()
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range *writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				if *rate > 0 { // key i is due at start + (i-from)/rate
					time.Sleep(time.Until(start.Add(time.Duration(i-from) * time.Second / time.Duration(*rate))))
				}
				if err := writeKey(ctx, st, tenant, i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

func writeKey(ctx context.Context, st *kv.Store, tenant string, i int) error {
	now := time.Now().UTC()
	rec := &kv.Record{State: kv.Pending, Tenant: tenant, JobID: fmt.Sprintf("01KBRETENTION%013d", i), Epoch: 1,
		Fingerprint: strings.Repeat("f", 64), Owner: kv.NewOwner(), Created: now, EpochStarted: now,
		LeaseUntil: now.Add(time.Minute), Model: "oncegate-mock", API: "openai", Backends: []string{"direct"},
		Request: []byte(`{"model":"oncegate-mock","messages":[{"role":"user","content":"retained key ` + strconv.Itoa(i) + `"}]}`)}
	rev, err := st.Claim(ctx, keyOf(tenant, i), rec)
	if err != nil {
		return fmt.Errorf("claim %d: %w", i, err)
	}
	done := rec.Completed(time.Now().UTC(), &kv.Result{Status: 200, Body: body(i), Backend: "direct"}, kv.Execution{Worker: "bench", Backend: "direct", Attempts: 1, Chunks: 1, Tokens: 16})
	if _, err := st.Update(ctx, keyOf(tenant, i), done, rev); err != nil {
		return fmt.Errorf("complete %d: %w", i, err)
	}
	return nil
}

// keyOf is the record key of tenant's client key i ("0", "1"…), derived as the gateway derives
// it (32 hex digits of a hash: as long as the gateway's and spread as randomly, which the
// server's subject tree, sharing common prefixes, is sensitive to).
func keyOf(tenant string, i int) string { return intent.RecordKey(1, tenant, strconv.Itoa(i)) }

// body is the answer of key i: a short chat completion (16 tokens), as the mock answers.
func body(i int) []byte {
	return []byte(`{"id":"chatcmpl-` + strconv.Itoa(i) + `","object":"chat.completion","created":1767225600,"model":"oncegate-mock",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("mock ", 16) + `"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}`)
}

func resultBody(rec *kv.Record) []byte {
	if rec.Result == nil {
		return nil
	}
	return rec.Result.Body
}
