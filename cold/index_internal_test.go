package cold

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble"
)

// TestIndexLayout: an index of another layout (none recorded: the hour-per-span layout before
// packs) or of another span (the TTL changed) is emptied at open and reported rebuilt; one of
// this layout and span keeps its entries.
func TestIndexLayout(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name    string
		change  func(ix *index) error
		ttl     time.Duration
		rebuilt bool
	}{
		{"same layout and span", func(*index) error { return nil }, 24 * time.Hour, false},
		{"no layout recorded", func(ix *index) error { return ix.db.Delete(metaLayout, pebble.Sync) }, 24 * time.Hour, true},
		{"another span", func(*index) error { return nil }, 48 * time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ix")
			ix, rebuilt, err := openIndex(dir, 24*time.Hour)
			if err != nil || !rebuilt {
				t.Fatalf("a new index: rebuilt %v, %v", rebuilt, err)
			}
			b := ix.newBatch()
			if err := b.put("key", entry{seq: 9, rev: 3, written: now, op: opPut, pos: 2}); err != nil {
				t.Fatal(err)
			}
			if err := b.commit(9, now); err != nil {
				t.Fatal(err)
			}
			if err := tc.change(ix); err != nil {
				t.Fatal(err)
			}
			if err := ix.close(); err != nil {
				t.Fatal(err)
			}
			ix, rebuilt, err = openIndex(dir, tc.ttl)
			if err != nil {
				t.Fatal(err)
			}
			defer ix.close()
			applied, _, err := ix.state()
			if err != nil {
				t.Fatal(err)
			}
			e, found, err := ix.lookup("key", now.Add(-time.Hour), now.Add(maxSkew))
			if err != nil {
				t.Fatal(err)
			}
			if rebuilt != tc.rebuilt || found == tc.rebuilt || (applied == 0) != tc.rebuilt {
				t.Fatalf("rebuilt %v, entry found %v, applied %d; want rebuilt %v", rebuilt, found, applied, tc.rebuilt)
			}
			if found && (e.seq != 9 || e.rev != 3 || e.pos != 2 || !e.written.Equal(time.Unix(0, now.UnixNano()))) {
				t.Errorf("entry %+v", e)
			}
		})
	}
}
