package cold

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// A pack is one OG_COLD message holding the copies of many hot records, in stream order: one
// stored message (and, on a synced server, one fsync) per pack instead of per record, which is
// what bounded the mover at about 5,000 records a second on one synced server. Its header
// hdrPack names the format; its body is, per record: uvarint len(key), key, uvarint revision,
// varint write time (unix ns), op byte, uvarint len(data), data.
//
// A record too large to share a pack (over packBytes/2) is copied alone, as a message whose
// headers carry its key, revision, write time and op and whose body is its data (the format
// every copy had before packs): the copy is never larger than the hot message it copies.
const (
	hdrPack    = "Og-Cold-Pack"
	packFormat = "1"
	// packBytes bounds a pack's body: a replay from the cold tier reads one pack.
	packBytes = 128 << 10
)

// ErrBadPack: a pack's body does not decode.
var ErrBadPack = errors.New("cold: malformed pack")

// record is one hot record's copy.
type record struct {
	key     string
	rev     uint64
	written time.Time
	op      byte
	data    []byte
}

// packedSize is an upper bound of r's bytes in a pack.
func (r record) packedSize() int {
	return len(r.key) + len(r.data) + 4*binary.MaxVarintLen64 + 1
}

// appendRecord appends r to a pack's body.
func appendRecord(b []byte, r record) []byte {
	b = binary.AppendUvarint(b, uint64(len(r.key)))
	b = append(b, r.key...)
	b = binary.AppendUvarint(b, r.rev)
	b = binary.AppendVarint(b, r.written.UnixNano())
	b = append(b, r.op)
	b = binary.AppendUvarint(b, uint64(len(r.data)))
	return append(b, r.data...)
}

// decodePack is a pack's records; their keys and data alias b.
func decodePack(b []byte) ([]record, error) {
	var out []record
	for len(b) > 0 {
		var r record
		var err error
		var key []byte
		if key, b, err = field(b); err != nil {
			return nil, err
		}
		r.key = string(key)
		rev, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, fmt.Errorf("%w: record %d: revision", ErrBadPack, len(out))
		}
		b = b[n:]
		written, n := binary.Varint(b)
		if n <= 0 || len(b) == n {
			return nil, fmt.Errorf("%w: record %d: write time", ErrBadPack, len(out))
		}
		r.rev, r.written, r.op, b = rev, time.Unix(0, written), b[n], b[n+1:]
		if r.op != opPut && r.op != opDel {
			return nil, fmt.Errorf("%w: record %d: op %q", ErrBadPack, len(out), r.op)
		}
		if r.data, b, err = field(b); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// field splits a uvarint-length-prefixed field off b.
func field(b []byte) ([]byte, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return nil, nil, fmt.Errorf("%w: a field's length", ErrBadPack)
	}
	return b[n : n+int(l)], b[n+int(l):], nil
}
