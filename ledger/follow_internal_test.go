package ledger

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestCatchUpReadsInBatches: three ledgers on the three servers of an R3 cluster take turns
// appending to one tenant's chain, so every append finds two entries it has not seen. The
// catch-up reads them with one batched direct get from its own server's replica, and asks the
// leader only for what that replica had not applied yet; before, it asked the leader for each
// entry and once more to learn there was none (three leader gets per append: issue 44's count,
// 4.9 of an intent's 7.7 JetStream requests). The chain verifies either way.
func TestCatchUpReadsInBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testkit.RunCluster(t, 3)
	ls := make([]*Ledger, 3)
	for i := range ls {
		_, js := cl.ConnectTo(t, i)
		if i == 0 {
			if err := EnsureReplicated(ctx, js, 3); err != nil {
				t.Fatal(err)
			}
		}
		ls[i] = New(js, nil, "USD")
	}
	var leaderGets, directGets atomic.Int64
	nc, _ := cl.ConnectTo(t, 0)
	for subject, n := range map[string]*atomic.Int64{"$JS.API.STREAM.MSG.GET." + StreamName: &leaderGets, "$JS.API.DIRECT.GET." + StreamName: &directGets} {
		if _, err := nc.Subscribe(subject, func(*nats.Msg) { n.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	charge := func(i int) Entry {
		t.Helper()
		e, err := ls[i%3].Charge(ctx, ChargeInput{Tenant: "acme", KeyHash: fmt.Sprintf("k%d", i), JobID: "j1",
			Epoch: 1, Attempt: 1, Model: "m", InputTokens: 10, OutputTokens: 5, Completed: true})
		if err != nil {
			t.Fatalf("charge %d: %v", i, err)
		}
		return e
	}
	for i := range 3 { // each ledger loads the chain once (its first use reads the whole subject)
		charge(i)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	leaderGets.Store(0)
	directGets.Store(0)
	const n = 60
	got := make([]Entry, 0, n)
	for i := 3; i < 3+n; i++ {
		got = append(got, charge(i))
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	lg, dg := leaderGets.Load(), directGets.Load()
	t.Logf("%d appends, each two entries behind: %d leader message gets (%.2f per append), %d direct gets", n, lg, float64(lg)/n, dg)
	if lg >= n {
		t.Errorf("%d leader message gets for %d appends: the catch-up reads entry by entry from the leader", lg, n)
	}
	if dg == 0 {
		t.Error("no direct get: the catch-up did not read from the local replica")
	}
	checkChain(ctx, t, ls[0], "acme", n+3, got)
}
