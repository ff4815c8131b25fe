package intent

import (
	"testing"
	"time"

	"github.com/oncegate/oncegate/kv"
)

func finalRecord(state kv.State, finished time.Time, body int) *kv.Record {
	return &kv.Record{State: state, Result: &kv.Result{Status: 200, Body: make([]byte, body), Finished: finished}}
}

func TestCacheable(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	cases := []struct {
		name string
		rec  *kv.Record
		want bool
	}{
		{"completed", finalRecord(kv.Completed, at, 10), true},
		{"pending", &kv.Record{State: kv.Pending}, false},
		{"completed without result", &kv.Record{State: kv.Completed}, false},
		{"completed without finish time", &kv.Record{State: kv.Completed, Result: &kv.Result{Status: 200}}, false},
		{"auto key", func() *kv.Record { r := finalRecord(kv.Completed, at, 1); r.Auto = true; return r }(), false},
		{"bypassed", func() *kv.Record { r := finalRecord(kv.Completed, at, 1); r.Bypassed = true; return r }(), false},
		{"final failure", finalRecord(kv.Failed, at, 1), true},
		{"retryable failure (claimed again)", func() *kv.Record { r := finalRecord(kv.Failed, at, 1); r.Result.Retryable = true; return r }(), false},
		{"cancelled", func() *kv.Record {
			r := finalRecord(kv.Failed, at, 1)
			r.Result.Retryable, r.Cancelled = true, true
			return r
		}(), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := cacheable(tc.rec); got != tc.want {
				t.Fatalf("cacheable = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFinishedCacheExpiresWithTheRecord(t *testing.T) {
	c := newFinishedCache(1 << 20)
	finished := time.Unix(1_700_000_000, 0)
	ttl := time.Hour
	c.put("k", finalRecord(kv.Completed, finished, 10), 7, ttl, finished.Add(time.Minute))
	if rec, rev, ok := c.get("k", finished.Add(ttl-time.Second)); !ok || rev != 7 || rec.State != kv.Completed {
		t.Fatalf("before expiry: ok=%v rev=%d", ok, rev)
	}
	if _, _, ok := c.get("k", finished.Add(ttl)); ok {
		t.Fatal("served at the record's expiry")
	}
	if c.len() != 0 {
		t.Fatalf("expired entry kept: %d entries", c.len())
	}
	// A record already expired is not taken.
	c.put("old", finalRecord(kv.Completed, finished, 10), 1, ttl, finished.Add(2*ttl))
	if c.len() != 0 {
		t.Fatal("kept a record that had already expired")
	}
}

func TestFinishedCacheBoundedInBytes(t *testing.T) {
	const max = 64 << 10
	c := newFinishedCache(max)
	now := time.Unix(1_700_000_000, 0)
	for i, key := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		c.put(key, finalRecord(kv.Completed, now, 6<<10), uint64(i+1), time.Hour, now)
		if _, _, ok := c.get("a", now); !ok { // keep "a" the most recently used
			t.Fatalf("after %s: the most recently used entry was evicted", key)
		}
		if c.size > max {
			t.Fatalf("after %s: %d bytes held, bound %d", key, c.size, max)
		}
	}
	if _, _, ok := c.get("b", now); ok {
		t.Fatal("the least recently used entry survived a full cache")
	}
	// One answer may not take more than an eighth of the cache.
	c.put("big", finalRecord(kv.Completed, now, max/8), 1, time.Hour, now)
	if _, _, ok := c.get("big", now); ok {
		t.Fatal("an answer larger than an eighth of the cache was cached")
	}
	c.forget("a")
	if _, _, ok := c.get("a", now); ok {
		t.Fatal("forgotten entry served")
	}
	var off *finishedCache // replay_cache_bytes: 0
	off.put("k", finalRecord(kv.Completed, now, 1), 1, time.Hour, now)
	if _, _, ok := off.get("k", now); ok {
		t.Fatal("a disabled cache served an entry")
	}
}
