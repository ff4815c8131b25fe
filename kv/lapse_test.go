package kv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

// TestAbandonedWaitsOutAnElection: a lease that ran out counts as abandoned only once the
// bucket has had its leader for a whole grace period. The same expired record at the same
// instant is abandoned under the first leader and not after an election that came later, so
// a lease that lapsed because its owner's renewals could not land is not taken over.
func TestAbandonedWaitsOutAnElection(t *testing.T) {
	c := testkit.RunCluster(t, 3)
	_, js := c.Connect(t)
	ctx := context.Background()
	st, err := kv.Open(ctx, js, kv.BucketConfig{TTL: time.Hour, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	const grace = 10 * time.Second
	before := time.Now()
	rec := pending("o1")
	rec.LeaseUntil = before.Add(-time.Second)
	live := pending("o2")
	live.LeaseUntil = before.Add(time.Hour)

	at := before.Add(grace) // an instant a grace after the election below could have ended
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !st.Abandoned(ctx, rec, at, grace) {
			return fmt.Errorf("an expired lease under the first leader, a grace after it was elected: not abandoned")
		}
		return nil
	})
	if st.Abandoned(ctx, live, at, grace) {
		t.Fatal("a running lease counted as abandoned")
	}

	c.Stop(c.StreamLeader(kv.BucketStream))
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if st.Abandoned(ctx, rec, at, grace) {
			return fmt.Errorf("still abandoned at the same instant: no election seen yet")
		}
		// False because the new leader is younger than the grace, not because the read failed.
		if !st.Abandoned(ctx, rec, time.Now().Add(grace+time.Second), grace) {
			return fmt.Errorf("not abandoned a grace after now: the leader is not readable yet")
		}
		return nil
	})
}

// TestAbandonedOnOneServer: a single server names no election; an expired lease is abandoned.
func TestAbandonedOnOneServer(t *testing.T) {
	st, _ := open(t)
	rec := pending("o1")
	now := time.Now()
	rec.LeaseUntil = now.Add(-time.Second)
	if !st.Abandoned(context.Background(), rec, now.Add(time.Minute), 10*time.Second) {
		t.Fatal("an expired lease on a single server: not abandoned")
	}
	rec.LeaseUntil = now.Add(time.Hour)
	if st.Abandoned(context.Background(), rec, now, 10*time.Second) {
		t.Fatal("a running lease counted as abandoned")
	}
}
