package kv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

type written struct {
	rev uint64
	err error
}

// TestUpdateRidesOutElection: the IDEM bucket (R3) loses its leader and its quorum. Beyond its
// window a write fails ErrUnavailable (never a raw NATS error); within it, a compare-and-set
// update keeps sending the same write, and once a server is back and a leader elected it is
// applied once, at the revision it expected.
func TestUpdateRidesOutElection(t *testing.T) {
	st, c, _ := openReplicated(t)
	ctx := context.Background()
	held, err := st.Claim(ctx, "held", pending("o1"))
	if err != nil {
		t.Fatal(err)
	}
	leader, other, survivor := c.LoseQuorum("KV_" + kv.Bucket)

	short, cancel := context.WithTimeout(ctx, time.Second)
	_, err = st.Claim(short, "late", pending("o3"))
	cancel()
	if !errors.Is(err, kv.ErrUnavailable) {
		t.Fatalf("claim without quorum past its window: %v, want ErrUnavailable", err)
	}

	tries := c.Watch(survivor, "$KV."+kv.Bucket+".held")
	updated := make(chan written, 1)
	done := pending("o1")
	done.State = kv.Completed
	done.Result = &kv.Result{Status: 200, Body: []byte(`{"ok":true}`)}
	go func() {
		// A deadline past the 4-9 s an election takes after the restart below.
		rev, err := st.UpdateBefore(ctx, "held", done, held, time.Now().Add(30*time.Second))
		updated <- written{rev, err}
	}()
	waitTries(t, tries, 2)
	c.Restart(other)
	c.Restart(leader) // three candidates elect sooner than two

	uw := testkit.RequireChanRead(t, updated, 30*time.Second)
	if uw.err != nil {
		t.Fatalf("update after the election: %v, want it applied", uw.err)
	}
	// Any replica answers a read, and the restarted one may not have caught up yet.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		rec, rev, err := st.Get(ctx, "held")
		if err != nil || rec.State != kv.Completed || rev != uw.rev {
			return fmt.Errorf("updated record: state %v rev %d err %v; want COMPLETED at %d", rec.State, rev, err, uw.rev)
		}
		return nil
	})
}

// TestClaimRetriesUntilTheBucketIsBack: a claim made while the bucket's stream is gone (a NATS
// restart lost it, and it is being recreated) is retried, the same create with the same owner
// nonce, until the bucket is back; then it is applied once and the record is ours.
func TestClaimRetriesUntilTheBucketIsBack(t *testing.T) {
	st, srv := open(t)
	ctx := context.Background()
	if err := srv.JS.DeleteKeyValue(ctx, kv.Bucket); err != nil {
		t.Fatal(err)
	}
	watch, _ := srv.Conn(t)
	tries := watchWrites(t, watch, "k")
	claimed := make(chan written, 1)
	go func() {
		rev, err := st.Claim(ctx, "k", pending("o"))
		claimed <- written{rev, err}
	}()
	waitTries(t, tries, 2)
	testkit.Recreate(t, func() error {
		_, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: time.Hour})
		return err
	})
	cw := testkit.RequireChanRead(t, claimed, 15*time.Second)
	if cw.err != nil {
		t.Fatalf("claim: %v, want it applied once the bucket is back", cw.err)
	}
	rec, rev, err := st.Get(ctx, "k")
	if err != nil || rec.Owner != "o" || rev != cw.rev {
		t.Fatalf("record: %v rev %d err %v; want owner o at %d", rec, rev, err, cw.rev)
	}
}

// TestIndexJobRetriesUntilTheStoreIsBack: a durable job index written while its bucket is
// gone (a restart lost them and setup is recreating them) is sent again until they
// are back, then JobKey finds it. Before, the first "no responders" failed the request (500).
func TestIndexJobRetriesUntilTheStoreIsBack(t *testing.T) {
	st, srv := open(t)
	ctx := context.Background()
	if err := srv.JS.DeleteKeyValue(ctx, kv.Bucket); err != nil {
		t.Fatal(err)
	}
	watch, _ := srv.Conn(t)
	tries := testkit.Watch(t, watch, "$KV."+kv.Bucket+".job.job-1")
	indexed := make(chan error, 1)
	go func() { indexed <- st.IndexJob(ctx, "job-1", "key-1") }()
	waitTries(t, tries, 2)
	testkit.Recreate(t, func() error {
		_, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: time.Hour})
		return err
	})
	if err := testkit.RequireChanRead(t, indexed, 15*time.Second); err != nil {
		t.Fatalf("index job: %v, want it written once the store is back", err)
	}
	if key, err := st.JobKey(ctx, "job-1"); err != nil || key != "key-1" {
		t.Fatalf("JobKey: %q %v, want key-1", key, err)
	}
}

// watchWrites watches key's subject in the bucket: every write is a plain message there.
func watchWrites(t *testing.T, nc *nats.Conn, key string) <-chan *nats.Msg {
	t.Helper()
	return testkit.Watch(t, nc, "$KV."+kv.Bucket+"."+key)
}

// waitTries waits for n tries. The watcher is itself a responder on the subject, so a write
// never gets "no responders" (which nats.go retries itself): each try is one request that
// waits for its deadline, and a second one is the store trying again.
func waitTries(t *testing.T, tries <-chan *nats.Msg, n int) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for seen := 0; seen < n; seen++ {
		select {
		case <-tries:
		case <-deadline:
			t.Fatalf("%d writes sent while the bucket was unavailable, want %d: the store gave up", seen, n)
		}
	}
}

// TestLanded: after an update that returned ErrUnavailable, Landed tells our own record
// (applied after all, at its revision) from another writer's (ErrConflict); a record the
// leader still holds at the old revision is ErrNotLanded (the write was not applied).
func TestLanded(t *testing.T) {
	st, _ := open(t)
	ctx := context.Background()
	rev, err := st.Claim(ctx, "k", pending("o"))
	if err != nil {
		t.Fatal(err)
	}
	renewed := pending("o")
	renewed.LeaseUntil = time.Now().Add(time.Minute)
	if _, err := st.Landed(ctx, "k", renewed, rev); !errors.Is(err, kv.ErrNotLanded) {
		t.Fatalf("record still at %d: %v, want ErrNotLanded", rev, err)
	}
	rev2, err := st.Update(ctx, "k", renewed, rev) // as if its answer had been lost
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.Landed(ctx, "k", renewed, rev); err != nil || got != rev2 {
		t.Fatalf("our write: rev %d err %v, want %d", got, err, rev2)
	}
	theirs := pending("o")
	theirs.Epoch = 2
	if _, err := st.Landed(ctx, "k", theirs, rev); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("another writer's record: %v, want ErrConflict", err)
	}
}

// TestLeaderSeen: a lease check that reads the bucket's leader remembers which server answered
// and since when it leads, for a taker's log line.
func TestLeaderSeen(t *testing.T) {
	st, c, _ := openReplicated(t)
	if name, since := st.LeaderSeen(); name != "" || !since.IsZero() {
		t.Fatalf("before any read: leader %q since %v, want none", name, since)
	}
	rec := pending("o")
	rec.LeaseUntil = time.Now().Add(-time.Minute)
	st.Abandoned(context.Background(), rec, time.Now(), time.Second) // reads the leader
	name, since := st.LeaderSeen()
	leader := c.StreamLeader(kv.BucketStream)
	if leader < 0 || name != c.Server(leader).Name() || since.IsZero() || since.After(time.Now()) {
		t.Fatalf("leader %q since %v, want server %d's name and its election time", name, since, leader)
	}
}
