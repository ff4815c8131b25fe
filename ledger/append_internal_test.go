package ledger

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

// startR3 starts a three-node cluster and returns n connections to it; with create, LEDGER
// is created at three replicas (atomic batches are used on replicated ledgers only).
func startR3(ctx context.Context, t *testing.T, n int, create bool) []jetstream.JetStream {
	t.Helper()
	cl := testkit.RunCluster(t, 3)
	js := make([]jetstream.JetStream, n)
	for i := range js {
		_, js[i] = cl.Connect(t)
	}
	if create {
		if err := EnsureReplicated(ctx, js[0], 3); err != nil {
			t.Fatal(err)
		}
	}
	return js
}

// chargeAll appends n charges of tenant at once from n goroutines spread over ls (ids from
// prefix), and returns the entries each got.
func chargeAll(ctx context.Context, t *testing.T, ls []*Ledger, tenant, prefix string, n int) []Entry {
	t.Helper()
	out, errs := chargeEach(ctx, ls, tenant, prefix, n)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("charge %d: %v", i, err)
		}
	}
	return out
}

// chargeEach is chargeAll that returns each charge's error (safe off the test's goroutine).
func chargeEach(ctx context.Context, ls []*Ledger, tenant, prefix string, n int) ([]Entry, []error) {
	out := make([]Entry, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out[i], errs[i] = ls[i%len(ls)].Charge(ctx, ChargeInput{Tenant: tenant, KeyHash: fmt.Sprintf("%s%d", prefix, i), JobID: "j1",
				Epoch: 1, Attempt: 1, Model: "m", InputTokens: 10, OutputTokens: 5, Completed: true})
		})
	}
	wg.Wait()
	return out, errs
}

// checkChain reads tenant's chain back: it verifies (under l's secret, if any), holds want
// entries with distinct ids, and each entry a charge returned sits at the sequence the charge
// said.
func checkChain(ctx context.Context, t *testing.T, l *Ledger, tenant string, want int, got []Entry) {
	t.Helper()
	// A scan reads with an ordered consumer, which a cluster may place on a replica a few
	// entries behind the leader that answered the appends: read until it has caught up with
	// the last sequence an append was answered with.
	var newest uint64
	for _, e := range got {
		newest = max(newest, e.Seq)
	}
	// Right after an election a scan can also stall on a replica that is still recovering
	// (seen once in TestBatchRidesOutElection: it waited out its whole context): each read gets
	// 5 s, and a failed one is tried again while the 30 s last.
	var es []Entry
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		es, err = l.Entries(rctx, tenant, time.Time{}, time.Time{})
		cancel()
		switch {
		case err != nil && time.Now().After(deadline):
			t.Fatal(err)
		case err != nil:
			continue
		}
		if len(es) > 0 && es[len(es)-1].Seq >= newest || time.Now().After(deadline) {
			break
		}
	}
	// A keyed ledger's chain is checked under its secret, every entry required keyed.
	if err := Check(es, VerifyOptions{Secret: l.secret, RequireKeyed: l.secret != nil}).Err(); err != nil {
		t.Fatalf("chain of %d entries does not verify: %v", len(es), err)
	}
	ids := map[string]uint64{}
	for _, e := range es {
		if _, dup := ids[e.ID]; dup {
			t.Fatalf("id %s stored twice", e.ID)
		}
		ids[e.ID] = e.Seq
	}
	for _, e := range got {
		if seq, ok := ids[e.ID]; !ok || seq != e.Seq {
			t.Errorf("charge %s was answered with seq %d; the stream has it at %d (found %v)", e.ID, e.Seq, seq, ok)
		}
	}
	if len(es) != want {
		t.Fatalf("chain holds %d entries, want %d", len(es), want)
	}
}

// TestConcurrentAppendsCommitInBatches: appends of one tenant that arrive together are
// committed as atomic batches, fewer commits than entries, and the chain they leave verifies,
// with every entry at the sequence its caller was told.
func TestConcurrentAppendsCommitInBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := New(startR3(ctx, t, 1, true)[0], nil, "USD")
	const n = 200
	got := chargeAll(ctx, t, []*Ledger{l}, "acme", "k", n)
	checkChain(ctx, t, l, "acme", n, got)
	if b := l.batches.Load(); b == 0 {
		t.Fatalf("%d concurrent appends committed without a single batch", n)
	} else {
		t.Logf("%d appends in %d atomic batches (and singles)", n, b)
	}
}

// TestBatchesFromTwoProcessesShareOneChain: two Ledgers (two connections, as two worker
// processes) append to one tenant at once, half of the ids on both: each id is stored once,
// and the chain verifies. A batch that loses the race for the head is refused whole and
// re-read, never interleaved.
func TestBatchesFromTwoProcessesShareOneChain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := startR3(ctx, t, 2, true)
	a, b := New(js[0], nil, "USD"), New(js[1], nil, "USD")
	const n = 150
	var wg sync.WaitGroup
	var fromA, fromB, shared []Entry
	wg.Go(func() { fromA = chargeAll(ctx, t, []*Ledger{a}, "acme", "a", n) })
	wg.Go(func() { fromB = chargeAll(ctx, t, []*Ledger{b}, "acme", "b", n) })
	wg.Go(func() { shared = chargeAll(ctx, t, []*Ledger{a, b}, "acme", "s", n) })
	wg.Wait()
	checkChain(ctx, t, a, "acme", 3*n, append(append(fromA, fromB...), shared...))
	if a.batches.Load()+b.batches.Load() == 0 {
		t.Fatal("no atomic batch was committed")
	}
}

// TestSameIDTwiceInOneGroup: two appends of one id that meet in one group store one entry,
// and both callers get it (one of them created it).
func TestSameIDTwiceInOneGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := New(startR3(ctx, t, 1, true)[0], nil, "USD")
	c := l.chain("acme")
	c.mu.Lock() // hold the chain so that every append below queues into one group
	e := l.entryFrom(KindCharge, ChargeID("k1", "j1", 1, 1), &ChargeInput{Tenant: "acme", KeyHash: "k1", JobID: "j1", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 3})
	other := l.entryFrom(KindCharge, ChargeID("k2", "j1", 1, 1), &ChargeInput{Tenant: "acme", KeyHash: "k2", JobID: "j1", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 3})
	type result struct {
		e       Entry
		created bool
		err     error
	}
	res := make([]result, 3)
	var wg sync.WaitGroup
	for i, en := range []Entry{e, other, e} {
		wg.Go(func() {
			out, created, err := l.append(ctx, en, nil, time.Time{})
			res[i] = result{out, created, err}
		})
	}
	waitQueued(t, c, 3)
	c.mu.Unlock()
	wg.Wait()
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("append %d: %v", i, r.err)
		}
	}
	if res[0].e.Seq != res[2].e.Seq || res[0].e.Hash != res[2].e.Hash {
		t.Fatalf("the two appends of one id got different entries: seq %d and %d", res[0].e.Seq, res[2].e.Seq)
	}
	if res[0].created == res[2].created {
		t.Fatalf("created = %v for both appends of one id; want exactly one", res[0].created)
	}
	checkChain(ctx, t, l, "acme", 2, []Entry{res[0].e, res[1].e})
	if l.batches.Load() != 1 {
		t.Fatalf("%d batches, want the one group committed as one", l.batches.Load())
	}
}

// TestQueuedAppendWithdrawnWhenItsContextEnds: an append still waiting in the queue when its
// caller gives up is withdrawn and never stored.
func TestQueuedAppendWithdrawnWhenItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := New(startR3(ctx, t, 1, true)[0], nil, "USD")
	c := l.chain("acme")
	c.mu.Lock()
	short, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.Charge(short, ChargeInput{Tenant: "acme", KeyHash: "k1", JobID: "j1", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 3})
		done <- err
	}()
	waitQueued(t, c, 1)
	stop()
	if err := <-done; err == nil {
		t.Fatal("an append whose context ended while queued succeeded")
	}
	c.mu.Unlock()
	e, err := l.Charge(ctx, ChargeInput{Tenant: "acme", KeyHash: "k2", JobID: "j1", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	checkChain(ctx, t, l, "acme", 1, []Entry{e})
}

// TestEnsureStreamAllowsAtomicBatches: a LEDGER created before batches (no allow_atomic) is
// updated in place by EnsureStream, and its appends are then batched.
func TestEnsureStreamAllowsAtomicBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := startR3(ctx, t, 1, false)[0]
	old := StreamConfig()
	old.AllowAtomicPublish, old.Replicas = false, 3
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := EnsureReplicated(ctx, js, 3); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CachedInfo().Config.AllowAtomicPublish {
		t.Fatal("EnsureStream left LEDGER without atomic publishes")
	}
	l := New(js, nil, "USD")
	got := chargeAll(ctx, t, []*Ledger{l}, "acme", "k", 50)
	checkChain(ctx, t, l, "acme", 50, got)
	if l.batches.Load() == 0 {
		t.Fatal("no batch after EnsureReplicated allowed them")
	}
}

// TestAppendsOneByOneWithoutAtomicPublish: on a LEDGER that refuses atomic batches (an
// operator's stream on an older server, say), and on a single replica, appends are published
// one by one and the chain is the same.
func TestAppendsOneByOneWithoutAtomicPublish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Run("one replica", func(t *testing.T) {
		srv := testkit.RunJetStream(t, 0)
		if err := EnsureStream(ctx, srv.JS); err != nil {
			t.Fatal(err)
		}
		l := New(srv.JS, nil, "USD")
		got := chargeAll(ctx, t, []*Ledger{l}, "acme", "k", 50)
		checkChain(ctx, t, l, "acme", 50, got)
		if l.batches.Load() != 0 {
			t.Fatalf("%d batches on a single-replica LEDGER", l.batches.Load())
		}
	})
	t.Run("atomic publishes off", func(t *testing.T) {
		js := startR3(ctx, t, 1, false)[0]
		cfg := StreamConfig()
		cfg.AllowAtomicPublish, cfg.Replicas = false, 3
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		l := New(js, nil, "USD")
		got := chargeAll(ctx, t, []*Ledger{l}, "acme", "k", 50)
		checkChain(ctx, t, l, "acme", 50, got)
		if l.batches.Load() != 0 {
			t.Fatalf("%d batches on a stream without atomic publishes", l.batches.Load())
		}
		// A Ledger that believes the stream takes batches learns otherwise from the refusal.
		l2 := New(js, nil, "USD")
		st, err := js.Stream(ctx, StreamName)
		if err != nil {
			t.Fatal(err)
		}
		info := *st.CachedInfo()
		info.Config.AllowAtomicPublish = true
		l2.st = fakeInfoStream{Stream: st, info: &info}
		got = chargeAll(ctx, t, []*Ledger{l2}, "acme", "x", 50)
		checkChain(ctx, t, l2, "acme", 100, got)
		if !l2.noAtomic.Load() {
			t.Fatal("a refused batch did not switch the ledger to appends one by one")
		}
	})
}

// fakeInfoStream is a real stream whose cached info says what the test wants.
type fakeInfoStream struct {
	jetstream.Stream
	info *jetstream.StreamInfo
}

func (s fakeInfoStream) CachedInfo() *jetstream.StreamInfo { return s.info }

// waitQueued waits until n appends wait in c's queue.
func waitQueued(t *testing.T, c *chain, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.qmu.Lock()
		q := len(c.queue)
		c.qmu.Unlock()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d appends queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBatchRidesOutElection: LEDGER (R3) loses its leader and its quorum while a group of
// charges is committing as one atomic batch. The batch is sent again, the same entries under
// the same expected head, until a leader is elected (the charges' deadline, 90 s, bounds it): every charge succeeds, each id is stored
// once, the chain verifies. Before, the first "no response from stream" failed every charge of
// the group (and the charge sweep had to write them later).
func TestBatchRidesOutElection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := testkit.RunCluster(t, 3)
	_, js := cl.Connect(t)
	if err := EnsureReplicated(ctx, js, 3); err != nil {
		t.Fatal(err)
	}
	l := New(js, nil, "USD")
	warm := chargeAll(ctx, t, []*Ledger{l}, "acme", "w", 4) // the chain is loaded, batches are on
	leader, other, survivor := cl.LoseQuorum(StreamName)
	tries := cl.Watch(survivor, Subject("acme"))
	type charged struct {
		entries []Entry
		errs    []error
	}
	done := make(chan charged, 1)
	go func() {
		entries, errs := chargeEach(ctx, []*Ledger{l}, "acme", "e", 32)
		done <- charged{entries, errs}
	}()
	for seen := 0; seen < 2; seen++ { // sent at least once while no leader could store it
		testkit.RequireChanRead(t, tries, 20*time.Second)
	}
	cl.Restart(other)
	cl.Restart(leader)
	got := testkit.RequireChanRead(t, done, 80*time.Second)
	for i, err := range got.errs {
		if err != nil {
			t.Fatalf("charge %d across the election: %v", i, err)
		}
	}
	checkChain(ctx, t, l, "acme", 36, append(warm, got.entries...))
	if l.batches.Load() == 0 {
		t.Fatal("no atomic batch was committed")
	}
}
