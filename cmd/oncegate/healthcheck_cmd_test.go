package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit"
)

// startServe runs `oncegate serve` in this process on a free 127.0.0.1 port with a fresh data
// dir (real embedded NATS) and returns its HTTP address once /readyz answers 200; it stops at cleanup.
func startServe(t *testing.T) string {
	t.Helper()
	addr := testkit.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan int, 1)
	stderr := &testkit.SyncBuffer{}
	go func() {
		done <- serveMain(ctx, []string{"--listen", addr, "--data-dir", filepath.Join(t.TempDir(), "data")},
			stderr, func(string) string { return "" }, func(*gateway.Gateway) { close(ready) })
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exit %d:\n%s", code, stderr.String())
		}
	})
	select {
	case <-ready:
	case code := <-done:
		done <- code
		t.Fatalf("serve exited %d before it served:\n%s", code, stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("serve not started within a minute:\n%s", stderr.String())
	}
	waitReady(t, addr, stderr.String) // started is not ready: /readyz is 503 until the streams are checked
	return addr
}

// waitReady polls http://addr/readyz until it answers 200 (a minute at most); logs gives what
// the gateway wrote, for the failure message.
func waitReady(t *testing.T, addr string, logs func() string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	testkit.CheckFor(t, time.Minute, 20*time.Millisecond, func() error {
		if err := testkit.Ready(client, "http://"+addr); err != nil {
			return fmt.Errorf("gateway never ready: %w\n%s", err, logs())
		}
		return nil
	})
}

// TestHealthcheck: `oncegate healthcheck` exits 0 against a real gateway's /readyz (found
// from ONCEGATE_LISTEN as the image sets it, or given as --url or ONCEGATE_HEALTHCHECK_URL), 1 with one line naming what
// it got for a 503 or a closed port, and 2 for arguments it cannot use.
func TestHealthcheck(t *testing.T) {
	gw := startServe(t)
	_, port, _ := strings.Cut(gw, ":")
	unready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"status":"unavailable"}`, http.StatusServiceUnavailable)
	}))
	defer unready.Close()
	closed := testkit.FreeAddr(t) // nothing listens there

	for _, tc := range []struct {
		name   string
		args   []string
		listen string // ONCEGATE_LISTEN
		url    string // ONCEGATE_HEALTHCHECK_URL
		code   int
		stdout string // exact, when code is 0
		stderr string // a part of the one line, when code is not 0
	}{
		{name: "ready gateway from ONCEGATE_LISTEN with a wildcard host", listen: "0.0.0.0:" + port, code: 0,
			stdout: "GET http://127.0.0.1:" + port + "/readyz: 200 OK\n"},
		{name: "ready gateway by --url", args: []string{"--url", "http://" + gw + "/readyz"}, code: 0,
			stdout: "GET http://" + gw + "/readyz: 200 OK\n"},
		{name: "liveness path", args: []string{"--url", "http://" + gw + "/healthz"}, code: 0,
			stdout: "GET http://" + gw + "/healthz: 200 OK\n"},
		// A worker-only container serves no /readyz: its health is its metrics listener, named
		// by the variable (docker run -e), since the image's HEALTHCHECK command is fixed.
		{name: "ONCEGATE_HEALTHCHECK_URL over ONCEGATE_LISTEN", listen: closed, url: "http://" + gw + "/metrics", code: 0,
			stdout: "GET http://" + gw + "/metrics: 200 OK\n"},
		{name: "--url over ONCEGATE_HEALTHCHECK_URL", args: []string{"--url", "http://" + gw + "/healthz"}, url: "http://" + closed + "/metrics", code: 0,
			stdout: "GET http://" + gw + "/healthz: 200 OK\n"},
		{name: "ONCEGATE_HEALTHCHECK_URL not a URL", url: "127.0.0.1:9464/metrics", code: 2,
			stderr: `oncegate healthcheck: ONCEGATE_HEALTHCHECK_URL "127.0.0.1:9464/metrics" is not an http(s) URL` + "\n"},
		{name: "not ready", args: []string{"--url", unready.URL + "/readyz"}, code: 1,
			stderr: "oncegate healthcheck: GET " + unready.URL + "/readyz: 503 Service Unavailable\n"},
		{name: "nothing listening", args: []string{"--url", "http://" + closed + "/readyz"}, code: 1,
			stderr: "connection refused"},
		{name: "not a URL", args: []string{"--url", "localhost:8080"}, code: 2,
			stderr: `oncegate healthcheck: --url "localhost:8080" is not an http(s) URL` + "\n"},
		{name: "ONCEGATE_LISTEN without a port", listen: "localhost", code: 2,
			stderr: `oncegate healthcheck: ONCEGATE_LISTEN "localhost": address localhost: missing port in address; pass --url` + "\n"},
		{name: "stray argument", args: []string{"http://" + gw + "/readyz"}, code: 2,
			stderr: "unexpected argument"},
		{name: "zero timeout", args: []string{"--url", "http://" + gw + "/readyz", "--timeout", "0s"}, code: 2,
			stderr: "--timeout must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			getenv := func(k string) string {
				switch k {
				case "ONCEGATE_LISTEN":
					return tc.listen
				case "ONCEGATE_HEALTHCHECK_URL":
					return tc.url
				}
				return ""
			}
			code := run(context.Background(), append([]string{"healthcheck"}, tc.args...), &stdout, &stderr, getenv)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, stdout.String(), stderr.String())
			}
			if tc.code == 0 && (stdout.String() != tc.stdout || stderr.Len() != 0) {
				t.Errorf("stdout %q stderr %q, want stdout %q", stdout.String(), stderr.String(), tc.stdout)
			}
			if tc.code != 0 && (!strings.Contains(stderr.String(), tc.stderr) || strings.Count(stderr.String(), "\n") != 1) {
				t.Errorf("stderr %q, want one line containing %q", stderr.String(), tc.stderr)
			}
		})
	}
}
