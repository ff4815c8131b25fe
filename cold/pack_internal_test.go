package cold

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPackRoundTrip(t *testing.T) {
	at := time.Unix(0, 1765000000123456789)
	records := []record{
		{key: "a", rev: 1, written: at, op: opPut, data: []byte(`{"state":"COMPLETED"}`)},
		{key: "", rev: 2, written: at.Add(time.Second), op: opPut, data: nil},
		{key: strings.Repeat("k", 300), rev: 1 << 40, written: time.Unix(0, 0), op: opDel},
		{key: "big", rev: 3, written: at, op: opPut, data: bytes.Repeat([]byte("x"), 70000)},
	}
	var body []byte
	for _, r := range records {
		body = appendRecord(body, r)
	}
	got, err := decodePack(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(records) {
		t.Fatalf("%d records, want %d", len(got), len(records))
	}
	for i, r := range records {
		g := got[i]
		if g.key != r.key || g.rev != r.rev || !g.written.Equal(r.written) || g.op != r.op || !bytes.Equal(g.data, r.data) {
			t.Errorf("record %d: %+v, want %+v", i, g, r)
		}
		if len(appendRecord(nil, r)) > r.packedSize() {
			t.Errorf("record %d: packed in %d bytes, packedSize says %d", i, len(appendRecord(nil, r)), r.packedSize())
		}
	}
	if got, err := decodePack(nil); err != nil || len(got) != 0 {
		t.Errorf("an empty pack: %v, %v", got, err)
	}
}

func TestPackMalformed(t *testing.T) {
	good := appendRecord(nil, record{key: "key", rev: 7, written: time.Unix(0, 5), op: opPut, data: []byte("data")})
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"truncated data", good[:len(good)-1]},
		{"truncated after the key", good[:4]},
		{"no op", good[:6]},
		{"a key longer than the pack", []byte{0x7f, 'k'}},
		{"a length overflowing", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"an unknown op", bytes.Replace(good, []byte{opPut}, []byte{'x'}, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodePack(tc.body); !errors.Is(err, ErrBadPack) {
				t.Errorf("decodePack(%q): %v, want ErrBadPack", tc.body, err)
			}
		})
	}
}

// FuzzDecodePack: any body either fails with ErrBadPack or decodes into records that encode
// back into a body decoding to the same records.
func FuzzDecodePack(f *testing.F) {
	f.Add(appendRecord(nil, record{key: "key", rev: 7, written: time.Unix(0, 5), op: opPut, data: []byte("data")}))
	f.Add(appendRecord(appendRecord(nil, record{key: "a", rev: 1, op: opDel}), record{key: "b", rev: 2, op: opPut}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		records, err := decodePack(body)
		if err != nil {
			if !errors.Is(err, ErrBadPack) {
				t.Fatalf("error %v is not ErrBadPack", err)
			}
			return
		}
		var again []byte
		for _, r := range records {
			again = appendRecord(again, r)
		}
		back, err := decodePack(again)
		if err != nil || len(back) != len(records) {
			t.Fatalf("re-encoded: %d records, %v; want %d", len(back), err, len(records))
		}
		for i := range records {
			a, b := records[i], back[i]
			if a.key != b.key || a.rev != b.rev || !a.written.Equal(b.written) || a.op != b.op || !bytes.Equal(a.data, b.data) {
				t.Fatalf("record %d: %+v, then %+v", i, a, b)
			}
		}
	})
}
