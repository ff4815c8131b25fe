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
