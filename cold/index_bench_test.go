package cold

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkLookupMiss: a new key's look-up in an index holding a day of keys (entries spread
// over 24 hours), the cost admission pays for every new key.
func BenchmarkLookupMiss(b *testing.B) {
	ix, _, err := openIndex(filepath.Join(b.TempDir(), "ix"), 24*time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	defer ix.close()
	now := time.Now()
	const keys = 1_000_000
	bt := ix.newBatch()
	for i := range keys {
		written := now.Add(-time.Duration(i) * 24 * time.Hour / keys)
		if err := bt.put(fmt.Sprintf("key-%d", i), entry{seq: uint64(i), rev: uint64(i), written: written, op: opPut}); err != nil {
			b.Fatal(err)
		}
		if i%10000 == 9999 {
			if err := bt.commit(uint64(i), time.Time{}); err != nil {
				b.Fatal(err)
			}
			bt = ix.newBatch()
		}
	}
	bt.discard()
	if err := ix.db.Flush(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	from, to := now.Add(-24*time.Hour), now.Add(maxSkew)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, err := ix.lookup(fmt.Sprintf("absent-%d", i), from, to); ok || err != nil {
			b.Fatal(ok, err)
		}
	}
	b.StopTimer()
	m := ix.db.Metrics()
	b.Logf("filter %+v cache %+v tablecache %+v", m.Filter, m.BlockCache, m.TableCache)
}
