package httpapi

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestDecodeBody: an encoded body decodes up to the limit, exactly; one byte more is
// errBodyTooLarge, whatever its compressed size; what is not the encoding it says is
// errBadEncoding.
func TestDecodeBody(t *testing.T) {
	const limit = 1000
	gz := func(s string) []byte {
		return compress(s, func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) })
	}
	zl := func(s string) []byte {
		return compress(s, func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) })
	}
	at, over := strings.Repeat("a", limit), strings.Repeat("a", limit+1)
	for _, tc := range []struct {
		name string
		enc  string
		raw  []byte
		want string
		err  error
	}{
		{name: "gzip at the limit", enc: "gzip", raw: gz(at), want: at},
		{name: "x-gzip", enc: "x-gzip", raw: gz("{}"), want: "{}"},
		{name: "deflate at the limit", enc: "deflate", raw: zl(at), want: at},
		{name: "gzip one byte over", enc: "gzip", raw: gz(over), err: errBodyTooLarge},
		{name: "deflate one byte over", enc: "deflate", raw: zl(over), err: errBodyTooLarge},
		{name: "a megabyte in a few hundred bytes", enc: "gzip", raw: gz(strings.Repeat("a", 1<<20)), err: errBodyTooLarge},
		{name: "two gzip members", enc: "gzip", raw: append(gz("{"), gz("}")...), want: "{}"},
		{name: "not gzip", enc: "gzip", raw: []byte("{}"), err: errBadEncoding},
		{name: "truncated gzip", enc: "gzip", raw: gz(at)[:20], err: errBadEncoding},
		{name: "gzip said deflate", enc: "deflate", raw: gz("{}"), err: errBadEncoding},
		{name: "empty", enc: "gzip", raw: nil, err: errBadEncoding},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeBody(tc.enc, tc.raw, limit)
			if !errors.Is(err, tc.err) || (tc.err == nil && string(got) != tc.want) {
				t.Fatalf("decodeBody = %d bytes, %v; want %d bytes, %v", len(got), err, len(tc.want), tc.err)
			}
		})
	}
}

func compress(s string, newWriter func(io.Writer) io.WriteCloser) []byte {
	var b bytes.Buffer
	w := newWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.Bytes()
}

// TestFitted: a large body in a buffer with much more room moves to one about its size (the
// allocator's size class); a small
// body, or one whose buffer fits it closely, stays where it is.
func TestFitted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		len, cap  int
		wantMoved bool
	}{
		{name: "4 MiB in 8 MiB", len: 4<<20 + 100, cap: 8 << 20, wantMoved: true},
		{name: "at the threshold, half empty", len: fitAbove, cap: 2 * fitAbove, wantMoved: true},
		{name: "small, half empty", len: fitAbove - 1, cap: 2 * fitAbove},
		{name: "large, a fifth empty", len: 4 << 20, cap: 4<<20 + 4<<20/5},
		{name: "large, full", len: 1 << 20, cap: 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := make([]byte, tc.len, tc.cap)
			body[0], body[tc.len-1] = 'x', 'y'
			got := fitted(body)
			moved := &got[0] != &body[0]
			if moved != tc.wantMoved || !bytes.Equal(got, body) || (moved && cap(got) > len(got)+len(got)/8) {
				t.Fatalf("moved %v (cap %d), same bytes %v; want moved %v", moved, cap(got), bytes.Equal(got, body), tc.wantMoved)
			}
		})
	}
}
