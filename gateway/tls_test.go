package gateway_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// selfSigned writes a fresh self-signed certificate for 127.0.0.1 and its key as PEM files in
// dir, and returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "oncegate test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestTLSListener: with http.tls_cert and http.tls_key the API is served over TLS only: a
// request and its retry get one execution's answer, a stream arrives whole, a plain-HTTP
// request or a TLS 1.1 client gets nothing, and a certificate that cannot be loaded fails the
// start naming its file and frees the port.
func TestTLSListener(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	cfg := gatewaykit.Config(t)
	cfg.HTTP.TLSCert, cfg.HTTP.TLSKey = certFile, keyFile
	gw := gatewaykit.StartGateway(t, cfg)
	if !strings.HasPrefix(gw.URL, "https://") {
		t.Fatalf("gateway URL %q, want https", gw.URL)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	chat := func(key, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("https request: %v", err)
		}
		defer resp.Body.Close()
		if resp.TLS == nil {
			t.Fatal("the answer came without TLS")
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}

	mock := gw.Mock(t, "mock")
	before := mock.Stats().Requests
	body := `{"model":"oncegate-mock","messages":[{"role":"user","content":"over tls aaaa"}]}`
	st1, first := chat("tls-1", body)
	st2, retry := chat("tls-1", body)
	if st1 != http.StatusOK || st2 != http.StatusOK || first != retry || !strings.Contains(first, `"choices"`) {
		t.Fatalf("over TLS: %d %s, then %d %s; want one 200 answer twice", st1, first, st2, retry)
	}
	if n := mock.Stats().Requests - before; n != 1 {
		t.Fatalf("%d backend executions for a request and its retry over TLS, want 1", n)
	}

	streamBody := `{"model":"oncegate-mock","stream":true,"messages":[{"role":"user","content":"over tls bbbb"}]}`
	st, events := chat("tls-2", streamBody)
	if st != http.StatusOK || !strings.Contains(events, "data: {") || !strings.HasSuffix(strings.TrimSpace(events), "data: [DONE]") {
		t.Fatalf("stream over TLS: %d\n%s", st, events)
	}

	// Plain HTTP on the TLS port: no answer is served (the handshake fails on its first bytes).
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + gw.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("plain HTTP on the TLS port answered %d", resp.StatusCode)
	}
	// A TLS 1.1 client is refused.
	conn, err := tls.Dial("tcp", gw.Addr(), &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}) // #nosec G402 -- the test checks that the server refuses it
	if err == nil {
		conn.Close()
		t.Fatal("a TLS 1.1 handshake succeeded; want TLS 1.2 or later only")
	}

	t.Run("certificate that cannot be loaded", func(t *testing.T) {
		for _, tc := range []struct{ name, cert, key string }{
			{"missing file", filepath.Join(t.TempDir(), "nope.pem"), keyFile},
			{"key of another certificate", certFile, func() string { _, k, _ := selfSigned(t, t.TempDir()); return k }()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := gatewaykit.Config(t)
				cfg.Listen = testkit.FreeAddr(t)
				cfg.HTTP.TLSCert, cfg.HTTP.TLSKey = tc.cert, tc.key
				g, err := start(t, cfg)
				var se *gateway.StartError
				if g != nil || !errors.As(err, &se) || se.Field != "http.tls_cert" || !strings.Contains(err.Error(), tc.cert) {
					t.Fatalf("gateway %v, err %v; want an http.tls_cert StartError naming %s", g, err, tc.cert)
				}
				ln, err := net.Listen("tcp", cfg.Listen)
				if err != nil {
					t.Fatalf("the refused gateway kept its HTTP port: %v", err)
				}
				ln.Close()
			})
		}
	})
}
