package kv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T) (*kv.Store, *testkit.JetStream) {
	t.Helper()
	s := testkit.RunJetStream(t, time.Second)
	st, err := kv.Open(context.Background(), s.JS, kv.BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return st, s
}

// openReplicated opens the bucket with three replicas on a three-server cluster.
func openReplicated(t *testing.T) (*kv.Store, *testkit.Cluster, jetstream.JetStream) {
	t.Helper()
	c := testkit.RunCluster(t, 3)
	_, js := c.Connect(t)
	st, err := kv.Open(context.Background(), js, kv.BucketConfig{TTL: time.Hour, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	return st, c, js
}

func pending(owner string) *kv.Record {
	return &kv.Record{State: kv.Pending, Tenant: "t", JobID: "J", Epoch: 1, Fingerprint: "fp", Owner: owner}
}

// TestClaimRace: many concurrent claimants on separate connections, exactly one winner per key.
func TestClaimRace(t *testing.T) {
	_, srv := open(t)
	ctx := context.Background()
	const keys, claimants = 20, 40
	stores := make([]*kv.Store, 4)
	for i := range stores {
		_, js := srv.Conn(t)
		st, err := kv.Open(ctx, js, kv.BucketConfig{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = st
	}
	for k := 0; k < keys; k++ {
		key := "race" + string(rune('a'+k))
		var wins, exists atomic.Int32
		var wg sync.WaitGroup
		for c := 0; c < claimants; c++ {
			wg.Add(1)
			go func(c int) {
				defer wg.Done()
				_, err := stores[c%len(stores)].Claim(ctx, key, pending(kv.NewOwner()))
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, kv.ErrExists):
					exists.Add(1)
				default:
					t.Errorf("claim: %v", err)
				}
			}(c)
		}
		wg.Wait()
		if wins.Load() != 1 || exists.Load() != claimants-1 {
			t.Fatalf("key %s: %d winners, %d ErrExists; want 1 and %d", key, wins.Load(), exists.Load(), claimants-1)
		}
	}
}

// TestClaimRetryIsRecognised: a claim retried by its own owner (the first try succeeded but its
// answer was lost) is reported as success, another owner's as ErrExists.
func TestClaimRetryIsRecognised(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	rec := pending("owner-1")
	rev, err := st.Claim(ctx, "k", rec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := st.Claim(ctx, "k", pending("owner-1"))
	if err != nil || again != rev {
		t.Fatalf("retried claim: rev %d err %v; want %d nil", again, err, rev)
	}
	_, err = st.Claim(ctx, "k", pending("owner-2"))
	var held *kv.ExistsError
	if !errors.Is(err, kv.ErrExists) || !errors.As(err, &held) {
		t.Fatalf("other owner: %v, want ErrExists with the holding record", err)
	}
	if held.Record.Owner != "owner-1" || held.Rev != rev {
		t.Fatalf("holding record: owner %q rev %d, want owner-1 rev %d", held.Record.Owner, held.Rev, rev)
	}
}

// TestClaimCarriesItsMsgID: the claim is published under its Nats-Msg-Id (kv.ClaimMsgID), so on
// a cluster a retry whose first try was stored is answered by the duplicate window with the
// claim's own revision, even once the record has moved on (the owner nonce alone would answer
// the record's latest revision); a claim of the same key by another claimant is not a
// duplicate. (One server checks the expected revision before the message id: there the retry
// is answered by the owner nonce, TestClaimRetryIsRecognised.)
func TestClaimCarriesItsMsgID(t *testing.T) {
	st, _, js := openReplicated(t)
	ctx := context.Background()
	rec := pending("owner-1")
	rev, err := st.Claim(ctx, "k", rec)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := js.Stream(ctx, st.Stream())
	if err != nil {
		t.Fatal(err)
	}
	claim, err := idem.GetMsg(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	if id := claim.Header.Get(jetstream.MsgIDHeader); id == "" || id != kv.ClaimMsgID("k", rec) {
		t.Fatalf("the claim's Nats-Msg-Id is %q, want %q", id, kv.ClaimMsgID("k", rec))
	}
	done := pending("owner-1")
	done.State = kv.Completed
	if _, err := st.Update(ctx, "k", done, rev); err != nil {
		t.Fatal(err)
	}
	again, err := st.Claim(ctx, "k", pending("owner-1"))
	if err != nil || again != rev {
		t.Fatalf("retried claim: rev %d err %v; want the claim's own revision %d", again, err, rev)
	}
	if _, err := st.Claim(ctx, "k", pending("owner-2")); !errors.Is(err, kv.ErrExists) {
		t.Fatalf("another claimant: %v, want ErrExists", err)
	}
}

// TestUpdateIsCompareAndSet: the revision fences writers; a stale one gets ErrConflict and
// changes nothing.
func TestUpdateIsCompareAndSet(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	rev, err := st.Claim(ctx, "k", pending("o"))
	if err != nil {
		t.Fatal(err)
	}
	done := pending("o")
	done.State = kv.Completed
	done.Result = &kv.Result{Status: 200, Body: []byte(`{"ok":true}`)}
	rev2, err := st.Update(ctx, "k", done, rev)
	if err != nil {
		t.Fatal(err)
	}
	zombie := pending("o")
	zombie.State = kv.Failed
	if _, err := st.Update(ctx, "k", zombie, rev); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("stale update: %v, want ErrConflict", err)
	}
	got, gotRev, err := st.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if gotRev != rev2 || got.State != kv.Completed || string(got.Result.Body) != `{"ok":true}` {
		t.Fatalf("record after stale write: rev %d state %s", gotRev, got.State)
	}
}

func TestGetMissing(t *testing.T) {
	st, _ := open(t)
	if _, _, err := st.Get(context.Background(), "nope"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	if _, err := st.JobKey(context.Background(), "01M8M6KBZQ869HNGDFDZKX9GR9"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

func TestJobIndex(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	if err := st.IndexJob(ctx, "01M8M6KBZQ869HNGDFDZKX9GR9", "abc"); err != nil {
		t.Fatal(err)
	}
	if k, err := st.JobKey(ctx, "01M8M6KBZQ869HNGDFDZKX9GR9"); err != nil || k != "abc" {
		t.Fatalf("JobKey = %q %v", k, err)
	}
}

func TestLeaseExpired(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name string
		rec  kv.Record
		want bool
	}{
		{"pending, lease ahead", kv.Record{State: kv.Pending, LeaseUntil: now.Add(time.Second)}, false},
		{"pending, lease behind", kv.Record{State: kv.Pending, LeaseUntil: now.Add(-time.Second)}, true},
		{"completed, lease behind", kv.Record{State: kv.Completed, LeaseUntil: now.Add(-time.Second)}, false},
		{"pending, no lease", kv.Record{State: kv.Pending}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.rec.LeaseExpired(now); got != tc.want {
				t.Fatalf("LeaseExpired = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestExpiredLeases finds exactly the PENDING records whose lease ran out, from headers.
func TestExpiredLeases(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	now := time.Now()
	mk := func(key string, state kv.State, lease time.Time) {
		rec := pending(kv.NewOwner())
		rec.State, rec.LeaseUntil = state, lease
		if _, err := st.Claim(ctx, key, rec); err != nil {
			t.Fatal(err)
		}
	}
	mk("live", kv.Pending, now.Add(time.Minute))
	mk("gone1", kv.Pending, now.Add(-time.Second))
	mk("gone2", kv.Pending, now.Add(-time.Hour))
	mk("done", kv.Completed, now.Add(-time.Hour))
	// A record that was PENDING and expired, then completed: its latest state counts.
	rec := pending("o")
	rec.LeaseUntil = now.Add(-time.Second)
	rev, err := st.Claim(ctx, "finished", rec)
	if err != nil {
		t.Fatal(err)
	}
	rec.State = kv.Completed
	if _, err := st.Update(ctx, "finished", rec, rev); err != nil {
		t.Fatal(err)
	}
	if err := st.IndexJob(ctx, "01M8M6KBZQ869HNGDFDZKX9GR9", "gone1"); err != nil {
		t.Fatal(err)
	}
	got, err := st.WatchLeases().Expired(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, e := range got {
		keys[e.Key] = true
	}
	if len(got) != 2 || !keys["gone1"] || !keys["gone2"] {
		t.Fatalf("expired = %+v, want gone1 and gone2", got)
	}
}

func TestExpiredLeasesEmpty(t *testing.T) {
	st, _ := open(t)
	got, err := st.WatchLeases().Expired(context.Background(), time.Now())
	if err != nil || len(got) != 0 {
		t.Fatalf("empty bucket: %v %v", got, err)
	}
}

// TestJobKeyFromProgress: a synchronous job's id is not indexed; its execution's progress
// names the record key, so JobKey finds it from the first send, at its latest epoch, and an id
// whose job never sent anything is unknown.
func TestJobKeyFromProgress(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	const id = "01M8M6KBZQ869HNGDFDZKX9GR8"
	if _, err := st.JobKey(ctx, id); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("JobKey before any progress: %v, want ErrNotFound", err)
	}
	for epoch := 1; epoch <= 2; epoch++ {
		if err := st.PutProgress("def", &kv.Progress{JobID: id, Epoch: epoch, Attempt: 1, Backend: "b"}); err != nil {
			t.Fatal(err)
		}
	}
	// Another job's progress does not answer for this one.
	if err := st.PutProgress("other", &kv.Progress{JobID: "01M8M6KBZQ869HNGDFDZKX9GR7", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	// Progress is written without waiting for the server.
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		k, err := st.JobKey(ctx, id)
		if err != nil {
			return fmt.Errorf("JobKey: %w", err)
		}
		if k != "def" {
			return fmt.Errorf("JobKey = %q, want %q", k, "def")
		}
		p, err := st.Progress(ctx, id, 2)
		if err != nil || p.Key != "def" || p.Epoch != 2 {
			return fmt.Errorf("epoch 2's progress = %+v %v, want key def", p, err)
		}
		return nil
	})
	if _, err := st.JobKey(ctx, "01M8M6KBZQ869HNGDFDZKX9GR6"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("JobKey of an id with no progress: %v, want ErrNotFound", err)
	}
}
