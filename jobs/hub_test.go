package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T) (*testkit.JetStream, *jobs.Hub) {
	t.Helper()
	srv := testkit.RunJetStream(t, time.Second)
	if err := jobs.EnsureStreams(context.Background(), srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	hub := jobs.NewHub(srv.NC, srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
	t.Cleanup(hub.Close)
	return srv, hub
}

func newJob(key string) *jobs.Job {
	return &jobs.Job{ID: jobs.NewID(), Key: key, Epoch: 1}
}

func readAll(t *testing.T, fl *jobs.Follower) []jobs.Chunk {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []jobs.Chunk
	for {
		c, err := fl.Next(ctx)
		if err != nil {
			t.Fatalf("after %d chunks: %v", len(out), err)
		}
		out = append(out, c)
		if c.Terminal() {
			return out
		}
	}
}

func checkSequence(t *testing.T, got []jobs.Chunk, n int) {
	t.Helper()
	if len(got) != n+1 {
		t.Fatalf("got %d chunks, want %d data + 1 terminal", len(got), n)
	}
	for i, c := range got[:n] {
		if c.Idx != i || c.Kind != jobs.KindData || string(c.Payload) != "p"+strconv.Itoa(i) {
			t.Fatalf("chunk %d = %+v", i, c)
		}
	}
	if got[n].Kind != jobs.KindDone {
		t.Fatalf("terminal = %s", got[n].Kind)
	}
}

func TestOpenThenPublish(t *testing.T) {
	srv, hub := setup(t)
	job := newJob("k1")
	fl, err := hub.Open(context.Background(), job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	pub := jobs.NewPublisher(srv.JS, job)
	for i := 0; i < 20; i++ {
		if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(context.Background(), jobs.KindDone, 200, nil); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, readAll(t, fl), 20)
	if _, err := fl.Next(context.Background()); !errors.Is(err, jobs.ErrEnded) {
		t.Fatalf("Next after terminal: %v, want ErrEnded", err)
	}
}

// TestJoinAtRandomPoints: followers joining a live execution at arbitrary moments, on this
// node's hub and on a second hub (another node), all get exactly the full sequence.
func TestJoinAtRandomPoints(t *testing.T) {
	srv, hub := setup(t)
	nc2, js2 := srv.Conn(t)
	hub2 := jobs.NewHub(nc2, js2, zerolog.Nop(), jobs.HubOptions{})
	defer hub2.Close()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	const n = 200
	job := newJob("k2")
	creator, err := hub.Open(context.Background(), job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	joinAt := map[int][]int{} // chunk index -> follower ids joining before it is published
	const followers = 24
	for f := 0; f < followers; f++ {
		at := rng.Intn(n + 1)
		joinAt[at] = append(joinAt[at], f)
	}
	results := make([][]jobs.Chunk, followers)
	var wg sync.WaitGroup
	join := func(f int) {
		h := hub
		if f%2 == 1 {
			h = hub2
		}
		fl, err := h.Join(context.Background(), job.Subject())
		if err != nil {
			t.Error(err)
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer fl.Close()
			results[f] = readAll(t, fl)
		}()
	}
	pub := jobs.NewPublisher(srv.JS, job)
	for i := 0; i <= n; i++ {
		for _, f := range joinAt[i] {
			join(f)
		}
		if i == n {
			break
		}
		if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(context.Background(), jobs.KindDone, 200, nil); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, readAll(t, creator), n)
	creator.Close()
	wg.Wait()
	for f, got := range results {
		t.Run(fmt.Sprintf("follower%d", f), func(t *testing.T) { checkSequence(t, got, n) })
	}
}

// TestJoinAfterFinish replays the whole history from the stream once the live feed is gone.
func TestJoinAfterFinish(t *testing.T) {
	srv, hub := setup(t)
	job := newJob("k3")
	pub := jobs.NewPublisher(srv.JS, job)
	for i := 0; i < 5; i++ {
		if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(context.Background(), jobs.KindDone, 200, nil); err != nil {
		t.Fatal(err)
	}
	fl, err := hub.Join(context.Background(), job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	checkSequence(t, readAll(t, fl), 5)
}

// TestCoreGapRecovers: chunks published before the core subscription existed are a gap on
// the core path; the feed re-reads them from the stream and delivers the full sequence.
func TestCoreGapRecovers(t *testing.T) {
	srv, hub := setup(t)
	job := newJob("k4")
	pub := jobs.NewPublisher(srv.JS, job)
	for i := 0; i < 3; i++ {
		if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	fl, err := hub.Open(context.Background(), job.Subject()) // core path, missed 0..2
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	for i := 3; i < 6; i++ {
		if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(context.Background(), jobs.KindDone, 200, nil); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, readAll(t, fl), 6)
}

// TestFenceStopsOldOwner: after a fence, the old owner's writes are refused and followers end
// with the fence chunk.
func TestFenceStopsOldOwner(t *testing.T) {
	srv, hub := setup(t)
	job := newJob("k5")
	fl, err := hub.Open(context.Background(), job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	pub := jobs.NewPublisher(srv.JS, job)
	if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p0")); err != nil {
		t.Fatal(err)
	}
	if err := jobs.Fence(context.Background(), srv.JS, job.Key, job.ID, job.Epoch); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), jobs.KindData, 0, []byte("p1")); !errors.Is(err, jobs.ErrFenced) {
		t.Fatalf("zombie publish: %v, want ErrFenced", err)
	}
	got := readAll(t, fl)
	if len(got) != 2 || got[0].Kind != jobs.KindData || got[1].Kind != jobs.KindFence {
		t.Fatalf("follower saw %+v", got)
	}
	// A second publisher for the same epoch (a redelivered job) cannot write either.
	if err := jobs.NewPublisher(srv.JS, job).Publish(context.Background(), jobs.KindData, 0, []byte("x")); !errors.Is(err, jobs.ErrFenced) {
		t.Fatalf("second owner publish: %v, want ErrFenced", err)
	}
}

func TestLastFollowerStopsFeed(t *testing.T) {
	_, hub := setup(t)
	fl, err := hub.Join(context.Background(), newJob("k6").Subject())
	if err != nil {
		t.Fatal(err)
	}
	if hub.Active() != 1 {
		t.Fatalf("active = %d", hub.Active())
	}
	fl.Close()
	if hub.Active() != 0 {
		t.Fatalf("active after close = %d", hub.Active())
	}
}

func TestHubCloseWakesFollowers(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	if err := jobs.EnsureStreams(context.Background(), srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	hub := jobs.NewHub(srv.NC, srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
	fl, err := hub.Open(context.Background(), newJob("k7").Subject())
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := fl.Next(context.Background())
		errc <- err
	}()
	hub.Close()
	if err := <-errc; !errors.Is(err, jobs.ErrHubClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	if _, err := hub.Join(context.Background(), "chunks.x.1"); !errors.Is(err, jobs.ErrHubClosed) {
		t.Fatalf("Join after Close: %v", err)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := func() nats.Header {
		return nats.Header{"Og-Job-V": {"2"}, "Og-Job-Id": {"x"}, "Og-Key": {"k"}, "Og-Epoch": {"1"}, "Og-Rev": {"3"}}
	}
	if _, err := jobs.Decode(valid(), []byte(`{}`)); err != nil {
		t.Fatalf("valid job rejected: %v", err)
	}
	cases := map[string]struct {
		drop, set, value string
		data             string
	}{
		"wrong version": {set: "Og-Job-V", value: "9", data: `{}`},
		"no version":    {drop: "Og-Job-V", data: `{}`},
		"no key":        {drop: "Og-Key", data: `{}`},
		"no id":         {drop: "Og-Job-Id", data: `{}`},
		"epoch zero":    {set: "Og-Epoch", value: "0", data: `{}`},
		"epoch text":    {set: "Og-Epoch", value: "one", data: `{}`},
		"no revision":   {drop: "Og-Rev", data: `{}`},
		"no record":     {data: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := valid()
			if tc.drop != "" {
				h.Del(tc.drop)
			}
			if tc.set != "" {
				h.Set(tc.set, tc.value)
			}
			if _, err := jobs.Decode(h, []byte(tc.data)); !errors.Is(err, jobs.ErrInvalidJob) {
				t.Fatalf("err = %v", err)
			}
		})
	}
	if !jobs.ParseID(jobs.NewID()) || jobs.ParseID("nope") {
		t.Fatal("ParseID")
	}
}

// TestFollowerReady: Ready says whether Next would return at once, so a writer can batch the
// chunks a follower is behind on.
func TestFollowerReady(t *testing.T) {
	srv, hub := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job := newJob("ready")
	pub := jobs.NewPublisher(srv.JS, job)
	for i := 0; i < 3; i++ {
		if err := pub.Publish(ctx, jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	fl, err := hub.Join(ctx, job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	for i := 0; i < 3; i++ {
		c, err := fl.Next(ctx)
		if err != nil || c.Idx != i {
			t.Fatalf("chunk %d: %+v %v", i, c, err)
		}
	}
	if fl.Ready() {
		t.Fatal("Ready with every published chunk read")
	}
	if err := pub.Publish(ctx, jobs.KindDone, 200, nil); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if !fl.Ready() {
			return errors.New("the terminal chunk never became ready")
		}
		return nil
	})
	if c, err := fl.Next(ctx); err != nil || !c.Terminal() {
		t.Fatalf("after Ready: %+v %v", c, err)
	}
	if fl.Ready() {
		t.Fatal("Ready after the terminal chunk")
	}
}

// TestSharedDerivedOncePerChunk: the followers of one feed share a chunk's derived payload;
// a chunk that did not come through a feed derives on every call.
func TestSharedDerivedOncePerChunk(t *testing.T) {
	srv, hub := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job := newJob("shared")
	pub := jobs.NewPublisher(srv.JS, job)
	if err := pub.Publish(ctx, jobs.KindData, 0, []byte("payload")); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	derive := func(b []byte) []byte { calls.Add(1); return append([]byte("derived:"), b...) }
	var followers []*jobs.Follower
	for i := 0; i < 5; i++ {
		fl, err := hub.Join(ctx, job.Subject())
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		followers = append(followers, fl)
	}
	var wg sync.WaitGroup
	for _, fl := range followers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := fl.Next(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if got := string(c.Shared(derive)); got != "derived:payload" {
				t.Errorf("Shared = %q", got)
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("derive ran %d times for one chunk of one feed, want 1", n)
	}
	if got := string((jobs.Chunk{Payload: []byte("x")}).Shared(derive)); got != "derived:x" || calls.Load() != 2 {
		t.Fatalf("a chunk outside a feed: %q after %d calls", got, calls.Load())
	}
}

// FuzzDecode: any job message either decodes to a job with a usable identity or is rejected
// with ErrInvalidJob; it never panics.
func FuzzDecode(f *testing.F) {
	f.Add("2", "01J0000000000000000000000A", "k", "1", "3", []byte(`{}`))
	f.Add("2", "x", "", "1", "1", []byte(`{}`))
	f.Add("1", "x", "k", "-1", "18446744073709551616", []byte(nil))
	f.Fuzz(func(t *testing.T, v, id, key, epoch, rev string, data []byte) {
		h := nats.Header{}
		for name, val := range map[string]string{"Og-Job-V": v, "Og-Job-Id": id, "Og-Key": key, "Og-Epoch": epoch, "Og-Rev": rev} {
			h.Set(name, val)
		}
		job, err := jobs.Decode(h, data)
		if err != nil {
			if !errors.Is(err, jobs.ErrInvalidJob) {
				t.Fatalf("error %v does not match ErrInvalidJob", err)
			}
			return
		}
		if job.ID == "" || job.Key == "" || job.Epoch < 1 || job.Rev == 0 || len(job.Record) == 0 {
			t.Fatalf("accepted a job without a usable identity: %+v", job)
		}
	})
}
