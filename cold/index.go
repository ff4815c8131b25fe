package cold

import (
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
// the hour of the record's write (unix hours, big endian) and the first 16 bytes of the
// key's SHA-256. Values: OG_COLD sequence, revision, write time (unix ns), op.
const (
	metaPrefix = 0x00
	recPrefix  = 0x01
	hashLen    = 16
	recKeyLen  = 1 + 4 + hashLen
	recValLen  = 8 + 8 + 8 + 1
)

var (
	metaApplied   = []byte{metaPrefix, 'a'}
	metaWatermark = []byte{metaPrefix, 'w'}
)

// op is what an index entry says of its key.
const (
	opPut byte = 'p'
	opDel byte = 'd'
)

// entry is one index value.
type entry struct {
	seq, rev uint64
	written  time.Time
	op       byte
}

func (e entry) encode() []byte {
	b := make([]byte, recValLen)
	binary.BigEndian.PutUint64(b[0:], e.seq)
	binary.BigEndian.PutUint64(b[8:], e.rev)
	binary.BigEndian.PutUint64(b[16:], uint64(e.written.UnixNano()))
	b[24] = e.op
	return b
}

func decodeEntry(b []byte) (entry, error) {
	if len(b) != recValLen {
		return entry{}, fmt.Errorf("cold: index value of %d bytes", len(b))
	}
	return entry{seq: binary.BigEndian.Uint64(b[0:]), rev: binary.BigEndian.Uint64(b[8:]),
		written: time.Unix(0, int64(binary.BigEndian.Uint64(b[16:]))), op: b[24]}, nil
}

func unixHour(t time.Time) uint32 { return uint32(t.Unix() / 3600) }

func recKey(hour uint32, sum []byte) []byte {
	k := make([]byte, recKeyLen)
	k[0] = recPrefix
	binary.BigEndian.PutUint32(k[1:], hour)
	copy(k[5:], sum)
	return k
}

func keyHash(key string) []byte {
	s := sha256.Sum256([]byte(key))
	return s[:hashLen]
}

// index is the local Pebble database.
type index struct {
	db *pebble.DB
}

// pebbleOptions keep the database's memory small and fixed: the index is read by point gets
// with bloom filters, and its data are a few tens of bytes per key.
func pebbleOptions(fs vfs.FS) *pebble.Options {
	o := &pebble.Options{FS: fs, MemTableSize: 4 << 20, MemTableStopWritesThreshold: 4,
		Cache: pebble.NewCache(8 << 20), MaxOpenFiles: 256, Logger: quietLogger{}}
	o.Levels = make([]pebble.LevelOptions, 7)
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloomPolicy
		o.Levels[i].BlockSize = 16 << 10
	}
	return o
}

// openIndex opens the database in dir ("" keeps it in memory), or starts it anew when its
// files cannot be opened: it is a cache of OG_COLD, rebuilt from the stream (rebuilt says so).
func openIndex(dir string) (ix *index, rebuilt bool, err error) {
	if dir == "" {
		db, err := pebble.Open("", pebbleOptions(vfs.NewMem()))
		if err != nil {
			return nil, false, fmt.Errorf("cold: open index: %w", err)
		}
		return &index{db: db}, true, nil
	}
	_, statErr := os.Stat(dir)
	db, err := pebble.Open(dir, pebbleOptions(vfs.Default))
	if err == nil {
		return &index{db: db}, statErr != nil, nil
	}
	if rerr := os.RemoveAll(dir); rerr != nil {
		return nil, false, fmt.Errorf("cold: open index %s: %w (and removing it: %w)", dir, err, rerr)
	}
	db, err2 := pebble.Open(dir, pebbleOptions(vfs.Default))
	if err2 != nil {
		return nil, false, fmt.Errorf("cold: open index %s after %w: %w", dir, err, err2)
	}
	return &index{db: db}, true, nil
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

// lookup finds key's newest entry in the hours from..to (inclusive).
func (ix *index) lookup(key string, from, to uint32) (entry, bool, error) {
	sum := keyHash(key)
	var best entry
	found := false
	for h := to; h >= from && h > 0; h-- {
		v, closer, err := ix.db.Get(recKey(h, sum))
		if errors.Is(err, pebble.ErrNotFound) {
			continue
		}
		if err != nil {
			return entry{}, false, fmt.Errorf("cold: index read: %w", err)
		}
		e, err := decodeEntry(v)
		closer.Close()
		if err != nil {
			return entry{}, false, err
		}
		if !found || e.rev > best.rev {
			best, found = e, true
		}
	}
	return best, found, nil
}

// batch collects one commit's changes.
type batch struct {
	b *pebble.Batch
}

func (ix *index) newBatch() *batch { return &batch{b: ix.db.NewBatch()} }

func (b *batch) put(key string, e entry) error {
	return b.b.Set(recKey(unixHour(e.written), keyHash(key)), e.encode(), nil)
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

// expire drops whole hours whose every entry is past ttl at now.
func (ix *index) expire(now time.Time, ttl time.Duration) error {
	end := unixHour(now.Add(-ttl))
	if end == 0 {
		return nil
	}
	if err := ix.db.DeleteRange(recKey(0, nil), recKey(end, nil), pebble.NoSync); err != nil {
		return fmt.Errorf("cold: index expiry: %w", err)
	}
	return nil
}

// wipe empties the database (OG_COLD was recreated under it).
func (ix *index) wipe() error {
	if err := ix.db.DeleteRange([]byte{metaPrefix}, []byte{recPrefix + 1}, pebble.Sync); err != nil {
		return fmt.Errorf("cold: index wipe: %w", err)
	}
	return nil
}

// quietLogger drops Pebble's informational lines; errors reach the tier's callers.
type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{})  {}
func (quietLogger) Errorf(string, ...interface{}) {}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	panic(fmt.Sprintf(format, args...))
}

// bloomPolicy: ten bits per key, about 1 % of lookups of an absent key read a block.
var bloomPolicy = bloom.FilterPolicy(10)
