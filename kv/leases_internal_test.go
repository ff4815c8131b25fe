package kv

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestLeaseWatchReadsOnlyWhatIsNew: the first call reads the last record of every key, later
// calls read only the records written since, and the answer follows each key's latest state.
func TestLeaseWatchReadsOnlyWhatIsNew(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := Open(ctx, srv.JS, BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	revs := map[string]uint64{}
	put := func(key string, state State, lease time.Time) {
		t.Helper()
		rec := &Record{State: state, Tenant: "t", JobID: "J", Epoch: 1, Fingerprint: "fp", Owner: "o", LeaseUntil: lease}
		var err error
		if rev, ok := revs[key]; ok {
			revs[key], err = st.Update(ctx, key, rec, rev)
		} else {
			revs[key], err = st.Claim(ctx, key, rec)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	w := st.WatchLeases()
	at := now
	check := func(step string, wantKeys []string, wantRead int) {
		t.Helper()
		got, err := w.Expired(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, e := range got {
			keys = append(keys, e.Key)
		}
		if !slices.Equal(keys, wantKeys) || w.readCount != wantRead {
			t.Fatalf("%s: expired %v after reading %d records; want %v after %d", step, keys, w.readCount, wantKeys, wantRead)
		}
	}
	put("a", Pending, now.Add(-time.Minute))
	put("b", Pending, now.Add(time.Minute))
	put("c", Pending, now.Add(-time.Hour))
	put("c", Completed, time.Time{})
	check("first call", []string{"a"}, 3) // the last record of a, b and c

	put("a", Completed, time.Time{})
	put("b", Pending, now.Add(-time.Second)) // b's owner stopped renewing
	put("d", Pending, now.Add(-2*time.Second))
	check("after three writes", []string{"d", "b"}, 3)
	check("nothing new", []string{"d", "b"}, 0)

	// No consumer is left behind (nats.go deletes the ones a fetch replaced asynchronously,
	// so allow it a moment).
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		info, err := srv.JS.Stream(ctx, "KV_"+Bucket)
		if err != nil {
			return err
		}
		if n := info.CachedInfo().State.Consumers; n != 0 {
			return fmt.Errorf("%d consumers left on the bucket after the sweeps", n)
		}
		return nil
	})

	// Records past the bucket's TTL are dropped by the server unseen: the watch forgets them.
	short := *st
	short.ttl = time.Nanosecond
	w, at = short.WatchLeases(), now.Add(time.Second)
	check("past the TTL", nil, 4)
	if len(w.pending) != 0 {
		t.Fatalf("%d keys still held after their records' TTL", len(w.pending))
	}

	// A recreated bucket starts its sequences again: the watch reads every key anew.
	w, at = st.WatchLeases(), now
	check("before the bucket is recreated", []string{"d", "b"}, 4)
	if err := srv.JS.DeleteKeyValue(ctx, Bucket); err != nil {
		t.Fatal(err)
	}
	testkit.Recreate(t, func() (err error) {
		st, err = Open(ctx, srv.JS, BucketConfig{TTL: time.Hour})
		return err
	})
	w.s, revs = st, map[string]uint64{}
	put("e", Pending, now.Add(-time.Minute))
	check("after the bucket was recreated", []string{"e"}, 1)
}
