package e2e

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// gzipped is s compressed as Content-Encoding: gzip.
func gzipped(s string) string { return compressed(s, gzip.NewWriter) }

// zlibbed is s compressed as Content-Encoding: deflate (zlib, as HTTP means it).
func zlibbed(s string) string { return compressed(s, zlib.NewWriter) }

func compressed[W io.WriteCloser](s string, newWriter func(io.Writer) W) string {
	var b bytes.Buffer
	w := newWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.String()
}

// TestEncodedRequestBody: a gzip or deflate body is the request it decodes to: it runs once,
// and a plain copy of it with the same Idempotency-Key gets that one result (the fingerprint is
// the decoded request's), as does an encoded copy of a plain request.
func TestEncodedRequestBody(t *testing.T) {
	gw := gatewaykit.StartGateway(t, gatewaykit.Config(t))
	mock := gw.Mock(t, "mock")
	for _, c := range []struct{ name, enc string }{{"gzip", "gzip"}, {"deflate", "deflate"}} {
		t.Run(c.name, func(t *testing.T) {
			body := chatBody("oncegate-mock", "encoded "+c.name, "")
			encoded := gzipped(body)
			if c.enc == "deflate" {
				encoded = zlibbed(body)
			}
			before := mock.Stats().Requests
			key := map[string]string{"Idempotency-Key": "enc-" + c.name}
			first := postChat(t, gw.URL, encoded, map[string]string{"Idempotency-Key": key["Idempotency-Key"], "Content-Encoding": c.enc})
			if first.Status != http.StatusOK {
				t.Fatalf("encoded request: status %d body %s", first.Status, first.Body)
			}
			plain := postChat(t, gw.URL, body, key)
			if plain.Status != http.StatusOK || plain.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(plain.Body, first.Body) {
				t.Fatalf("plain copy: status %d replayed %q, same answer %v; want the encoded request's answer replayed",
					plain.Status, plain.Header.Get("Idempotent-Replayed"), bytes.Equal(plain.Body, first.Body))
			}
			if n := mock.Stats().Requests - before; n != 1 {
				t.Fatalf("backend executions = %d, want 1", n)
			}
		})
	}
}
