package cold

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/bloom"
	"github.com/cockroachdb/pebble/vfs"
)

// The index's keys: meta keys start with metaPrefix, record keys with recPrefix followed by
// the span of the record's write (unix time / the index's span, big endian) and the first 16
// bytes of the key's SHA-256. Values: OG_COLD sequence, revision, write time (unix ns), op,
// and the record's position in its pack.
const (
	metaPrefix = 0x00
	recPrefix  = 0x01
	hashLen    = 16
	recKeyLen  = 1 + 4 + hashLen
	recValLen  = 8 + 8 + 8 + 1 + 4
)

var (
	metaApplied   = []byte{metaPrefix, 'a'}
	metaWatermark = []byte{metaPrefix, 'w'}
	// metaLayout holds the span (seconds) of an index in this layout; an index without it
	// (an earlier layout: an hour per span, no pack positions) or with another span is
	// rebuilt from OG_COLD.
	metaLayout = []byte{metaPrefix, 'l', '2'}
)

// op is what an index entry says of its key.
const (
	opPut byte = 'p'
	opDel byte = 'd'
)

// maxSkew is how far in the future of this node's clock a record's write time (the IDEM
// leader's clock) may be and still be found.
const maxSkew = 5 * time.Minute

// spanOf is the index's time span for keys kept ttl: a quarter of it in whole hours, at least
// one. A look-up probes each span the TTL covers (five for a day) and expiry drops whole
// spans, so an entry outlives its TTL on disk by at most one span.
func spanOf(ttl time.Duration) time.Duration {
	return max(time.Hour, (ttl / 4).Truncate(time.Hour))
}

// entry is one index value.
type entry struct {
	seq, rev uint64
	written  time.Time
	op       byte
	pos      uint32
}

func (e entry) encode() []byte {
	b := make([]byte, recValLen)
	binary.BigEndian.PutUint64(b[0:], e.seq)
	binary.BigEndian.PutUint64(b[8:], e.rev)
	binary.BigEndian.PutUint64(b[16:], uint64(e.written.UnixNano()))
	b[24] = e.op
	binary.BigEndian.PutUint32(b[25:], e.pos)
	return b
}

func decodeEntry(b []byte) (entry, error) {
	if len(b) != recValLen {
		return entry{}, fmt.Errorf("cold: index value of %d bytes", len(b))
	}
	return entry{seq: binary.BigEndian.Uint64(b[0:]), rev: binary.BigEndian.Uint64(b[8:]),
		written: time.Unix(0, int64(binary.BigEndian.Uint64(b[16:]))), op: b[24],
		pos: binary.BigEndian.Uint32(b[25:])}, nil
}

func unixHour(t time.Time) uint32 { return uint32(t.Unix() / 3600) }

func recKey(span uint32, sum []byte) []byte {
	k := make([]byte, recKeyLen)
	k[0] = recPrefix
	binary.BigEndian.PutUint32(k[1:], span)
	copy(k[5:], sum)
	return k
}

func keyHash(key string) []byte {
	s := sha256.Sum256([]byte(key))
	return s[:hashLen]
}

// index is the local Pebble database.
type index struct {
	db   *pebble.DB
	span int64 // seconds
}

// spanAt is the span holding time t.
func (ix *index) spanAt(t time.Time) uint32 { return uint32(t.Unix() / ix.span) }

// pebbleOptions keep the database's memory small and fixed: the index is read by point
// look-ups through bloom filters (L6's included), and its data are a few tens of bytes per key.
// Pebble reserves its memtables' size in the block cache: with a cache no larger than them
// nothing is cached, and every look-up read and checked its filter blocks from disk (about
// 300 us per new key at a million keys, against 11 us with them cached).
func pebbleOptions(fs vfs.FS, cache *pebble.Cache) *pebble.Options {
	o := &pebble.Options{FS: fs, Comparer: &comparer, MemTableSize: memTableSize, MemTableStopWritesThreshold: 4,
		Cache: cache, MaxOpenFiles: 256, Logger: quietLogger{}}
	o.Levels = make([]pebble.LevelOptions, 7)
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloomPolicy
		o.Levels[i].BlockSize = 16 << 10
	}
	return o
}

// memTableSize, and cacheSize: room for the filters of about 10 M keys once two memtables
// are reserved.
const (
	memTableSize = 4 << 20
	cacheSize    = 24 << 20
)

// openIndex opens the database in dir ("" keeps it in memory) for keys kept ttl, or starts it
// anew when its files cannot be opened or are of another layout or span: it is a cache of
// OG_COLD, rebuilt from the stream (rebuilt says so).
func openIndex(dir string, ttl time.Duration) (ix *index, rebuilt bool, err error) {
	span := int64(spanOf(ttl) / time.Second)
	cache := pebble.NewCache(cacheSize)
	defer cache.Unref() // the database holds its own reference
	if dir == "" {
		db, err := pebble.Open("", pebbleOptions(vfs.NewMem(), cache))
		if err != nil {
			return nil, false, fmt.Errorf("cold: open index: %w", err)
		}
		ix := &index{db: db, span: span}
		return ix, true, ix.setLayout()
	}
	_, statErr := os.Stat(dir)
	rebuilt = statErr != nil
	db, err := pebble.Open(dir, pebbleOptions(vfs.Default, cache))
	if err != nil {
		if rerr := os.RemoveAll(dir); rerr != nil {
			return nil, false, fmt.Errorf("cold: open index %s: %w (and removing it: %w)", dir, err, rerr)
		}
		var err2 error
		if db, err2 = pebble.Open(dir, pebbleOptions(vfs.Default, cache)); err2 != nil {
			return nil, false, fmt.Errorf("cold: open index %s after %w: %w", dir, err, err2)
		}
		rebuilt = true
	}
	ix = &index{db: db, span: span}
	if got, err := ix.getUint(metaLayout); err != nil || got != uint64(span) {
		if err := ix.wipe(); err != nil {
			_ = ix.close()
			return nil, false, err
		}
		rebuilt = true
	}
	return ix, rebuilt, nil
}

// setLayout records the index's layout and span.
func (ix *index) setLayout() error {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(ix.span))
	if err := ix.db.Set(metaLayout, buf[:], pebble.Sync); err != nil {
		return fmt.Errorf("cold: index layout: %w", err)
	}
	return nil
}

func (ix *index) close() error { return ix.db.Close() }

func (ix *index) getUint(k []byte) (uint64, error) {
	v, closer, err := ix.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cold: index read: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("cold: index meta value of %d bytes", len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// state is the applied OG_COLD sequence and watermark the database holds.
func (ix *index) state() (applied uint64, watermark time.Time, err error) {
	if applied, err = ix.getUint(metaApplied); err != nil {
		return 0, time.Time{}, err
	}
	w, err := ix.getUint(metaWatermark)
	if err != nil {
		return 0, time.Time{}, err
	}
	if w > 0 {
		watermark = time.Unix(0, int64(w))
	}
	return applied, watermark, nil
}

// lookup finds key's newest entry written in from..to, with one iterator with L6's filters on:
// most looked-up keys are new, and without them (Get's default) each span's miss reads a
// data block of the bottom level.
func (ix *index) lookup(key string, from, to time.Time) (entry, bool, error) {
	sum := keyHash(key)
	it, err := ix.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return entry{}, false, fmt.Errorf("cold: index read: %w", err)
	}
	defer it.Close()
	var best entry
	found := false
	first, last := ix.spanAt(from), ix.spanAt(to)
	for sp := last; sp >= first && sp > 0; sp-- {
		k := recKey(sp, sum)
		if !it.SeekPrefixGE(k) || !bytes.Equal(it.Key(), k) {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return entry{}, false, fmt.Errorf("cold: index read: %w", err)
		}
		e, err := decodeEntry(v)
		if err != nil {
			return entry{}, false, err
		}
		if !found || e.rev > best.rev {
			best, found = e, true
		}
	}
	if err := it.Error(); err != nil {
		return entry{}, false, fmt.Errorf("cold: index read: %w", err)
	}
	return best, found, nil
}

// batch collects one commit's changes.
type batch struct {
	ix *index
	b  *pebble.Batch
}

func (ix *index) newBatch() *batch { return &batch{ix: ix, b: ix.db.NewBatch()} }

func (b *batch) put(key string, e entry) error {
	return b.b.Set(recKey(b.ix.spanAt(e.written), keyHash(key)), e.encode(), nil)
}

func putUint(b *pebble.Batch, k []byte, v uint64) error {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	return b.Set(k, buf[:], nil)
}

// commit writes the batch with the applied sequence (and watermark, when set) in it: the
// database's state always matches its entries. Not synced: a crash loses a tail the applier
// reads again from OG_COLD.
func (b *batch) commit(applied uint64, watermark time.Time) error {
	if err := putUint(b.b, metaApplied, applied); err != nil {
		return err
	}
	if !watermark.IsZero() {
		if err := putUint(b.b, metaWatermark, uint64(watermark.UnixNano())); err != nil {
			return err
		}
	}
	if err := b.b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("cold: index commit: %w", err)
	}
	return b.b.Close()
}

func (b *batch) discard() { _ = b.b.Close() }

// expire drops the whole spans whose every entry is past ttl at now.
func (ix *index) expire(now time.Time, ttl time.Duration) error {
	end := ix.spanAt(now.Add(-ttl))
	if end == 0 {
		return nil
	}
	if err := ix.db.DeleteRange(recKey(0, nil), recKey(end, nil), pebble.NoSync); err != nil {
		return fmt.Errorf("cold: index expiry: %w", err)
	}
	return nil
}

// wipe empties the database (OG_COLD was recreated under it, or it is of another layout).
func (ix *index) wipe() error {
	if err := ix.db.DeleteRange([]byte{metaPrefix}, []byte{recPrefix + 1}, pebble.Sync); err != nil {
		return fmt.Errorf("cold: index wipe: %w", err)
	}
	return ix.setLayout()
}

// quietLogger drops Pebble's informational lines; errors reach the tier's callers.
type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{})  {}
func (quietLogger) Errorf(string, ...interface{}) {}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	panic(fmt.Sprintf(format, args...))
}

// comparer is Pebble's default (its name, so existing indexes open) with Split: the whole
// key is its own prefix, as the default's filters are built, and SeekPrefixGE may use them.
var comparer = func() pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Split = func(k []byte) int { return len(k) }
	return c
}()

// bloomPolicy: ten bits per key, about 1 % of lookups of an absent key read a block.
var bloomPolicy = bloom.FilterPolicy(10)
