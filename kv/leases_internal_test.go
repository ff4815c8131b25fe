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
	expired := func() ([]string, error) { // the keys of one read, in its order
		got, err := w.Expired(ctx, at)
		var keys []string
		for _, e := range got {
			keys = append(keys, e.Key)
		}
		return keys, err
	}
	check := func(step string, wantKeys []string, wantRead int) { // wantRead -1: any
		t.Helper()
		keys, err := expired()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys, wantKeys) || (wantRead >= 0 && w.readCount != wantRead) {
			t.Fatalf("%s: expired %v after reading %d records; want %v after %d", step, keys, w.readCount, wantKeys, wantRead)
		}
	}
	// A no-wait fetch can come before the server has told the watch's consumer of a record
	// just stored (CI saw one read nothing right after a write; the sweep reads it on its next
	// round): after writes, read until the answer is wantKeys, counting every record read.
	eventually := func(step string, wantKeys []string, wantRead int) { // wantRead -1: any
		t.Helper()
		read := 0
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			keys, err := expired()
			if err != nil {
				return err
			}
			read += w.readCount
			if !slices.Equal(keys, wantKeys) {
				return fmt.Errorf("%s: expired %v after reading %d records; want %v", step, keys, read, wantKeys)
			}
			return nil
		})
		if wantRead >= 0 && read != wantRead {
			t.Fatalf("%s: %d records read; want %d", step, read, wantRead)
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
	eventually("after three writes", []string{"d", "b"}, 3)
	check("nothing new", []string{"d", "b"}, 0)

	// One consumer serves every call (a consumer per read cost a pass over every key's
	// subject state in the server); Close deletes it.
	consumers := func() int {
		t.Helper()
		info, err := srv.JS.Stream(ctx, "KV_"+Bucket)
		if err != nil {
			t.Fatal(err)
		}
		return info.CachedInfo().State.Consumers
	}
	name := w.cons.CachedInfo().Name
	put("b", Completed, time.Time{})
	eventually("one more write", []string{"d"}, 1)
	if got := w.cons.CachedInfo().Name; got != name || consumers() != 1 {
		t.Fatalf("consumer %s, %d on the bucket; want the same %s, 1", got, consumers(), name)
	}

	// The consumer gone (deleted after being idle, or by an operator): the watch creates
	// another that starts after the last record it applied, and misses nothing.
	if err := srv.JS.DeleteConsumer(ctx, "KV_"+Bucket, name); err != nil {
		t.Fatal(err)
	}
	put("f", Pending, now.Add(-3*time.Second))
	if _, err := w.Expired(ctx, at); err != nil {
		t.Logf("the read that found its consumer gone: %v", err)
	}
	put("g", Pending, now.Add(-4*time.Second))
	eventually("after the consumer was replaced", []string{"g", "f", "d"}, -1)
	w.Close(ctx)
	if n := consumers(); n != 0 {
		t.Fatalf("%d consumers left on the bucket after Close", n)
	}
	put("f", Completed, time.Time{})
	put("g", Completed, time.Time{})

	// Records past the bucket's TTL are dropped by the server unseen: the watch forgets them.
	short := *st
	short.ttl = time.Nanosecond
	w, at = short.WatchLeases(), now.Add(time.Second)
	check("past the TTL", nil, 6)
	if len(w.pending) != 0 {
		t.Fatalf("%d keys still held after their records' TTL", len(w.pending))
	}

	// A recreated bucket starts its sequences again: the watch reads every key anew.
	w, at = st.WatchLeases(), now
	check("before the bucket is recreated", []string{"d"}, 6)
	if err := srv.JS.DeleteKeyValue(ctx, Bucket); err != nil {
		t.Fatal(err)
	}
	testkit.Recreate(t, func() (err error) {
		st, err = Open(ctx, srv.JS, BucketConfig{TTL: time.Hour})
		return err
	})
	w.s, revs = st, map[string]uint64{}
	put("e", Pending, now.Add(-time.Minute))
	// The first read finds the watch's consumer gone with the old stream; the next asks the
	// stream, finds it behind, and reads every key of the new bucket.
	if _, err := w.Expired(ctx, at); err == nil {
		t.Fatal("the read after the bucket was recreated did not fail: its consumer went with the old stream")
	}
	check("after the bucket was recreated", []string{"e"}, 1)
}
