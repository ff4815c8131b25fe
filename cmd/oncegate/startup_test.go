package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// runMainEnv makes the test binary run main instead of the tests: the start-up tests need
// real processes (exit codes, what reaches stderr, a lock held by another pid) without a
// go build.
const runMainEnv = "ONCEGATE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// oncegateCmd is the test binary as `oncegate args…`, with a clean environment.
func oncegateCmd(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = []string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	return cmd
}

// runOncegate runs `oncegate args…` to its end and returns its exit code and stderr.
func runOncegate(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := oncegateCmd(ctx, t, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	case err != nil:
		t.Fatalf("oncegate %v: %v", args, err)
	}
	return 0, stderr.String()
}

// busyAddr is a 127.0.0.1 address held by a listener until the test ends.
func busyAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// pprofHint ends the start failure of a --pprof address that cannot be served.
const pprofHint = "; pass a free loopback address as --pprof, e.g. 127.0.0.1:6060"

// TestServeStartFailures: a start that cannot succeed exits 1 with one line on stderr that
// says what failed and which flag to change, no panic and no stack. A taken HTTP port fails
// before the store is touched.
func TestServeStartFailures(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	httpBusy, natsBusy, pprofBusy := busyAddr(t), busyAddr(t), busyAddr(t)
	for _, tc := range []struct {
		name      string
		args      []string
		want      string // the whole line
		untouched string // a path the failed start must not create
	}{
		{
			name:      "HTTP port taken",
			args:      []string{"serve", "--listen", httpBusy, "--data-dir", filepath.Join(tmp, "d1")},
			want:      "oncegate: listen " + httpBusy + ": address already in use; pass --listen",
			untouched: filepath.Join(tmp, "d1"),
		},
		{
			name: "data dir is a file",
			args: []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", file},
			want: "oncegate: data dir " + file + " is not usable: mkdir " + file + ": not a directory; pass a writable directory as --data-dir",
		},
		{
			name: "data dir under a file",
			args: []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(file, "data")},
			want: "oncegate: data dir " + filepath.Join(file, "data") + " is not usable: mkdir " + file + ": not a directory; pass a writable directory as --data-dir",
		},
		{
			name: "NATS port taken",
			args: []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d2"), "--nats-listen", natsBusy},
			want: "oncegate: nats listen " + natsBusy + ": address already in use; pass another --nats-listen",
		},
		{
			name:      "TLS certificate without its key",
			args:      []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d4"), "--tls-cert", file},
			want:      "oncegate: http.tls_key: must be set with http.tls_cert (--tls-key with --tls-cert)",
			untouched: filepath.Join(tmp, "d4"),
		},
		{
			name:      "TLS certificate that is no PEM",
			args:      []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d5"), "--tls-cert", file, "--tls-key", file},
			want:      "oncegate: TLS certificate " + file + " with key " + file + ": tls: failed to find any PEM data in certificate input; pass a readable PEM certificate and its key as --tls-cert and --tls-key",
			untouched: filepath.Join(tmp, "d5"),
		},
		{
			name:      "replicas that NATS cannot keep a majority with",
			args:      []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d6"), "--nats-replicas", "2"},
			want:      "oncegate: nats.replicas: must be 1, 3 or 5 (or 0: 1 on a single server, 3 on a cluster of 3 or more), got 2",
			untouched: filepath.Join(tmp, "d6"),
		},
		{
			name:      "pprof on an address that is not loopback",
			args:      []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d7"), "--pprof", "0.0.0.0:6060"},
			want:      "oncegate: pprof 0.0.0.0:6060: not a loopback address (the profiling endpoints have no authentication)" + pprofHint,
			untouched: filepath.Join(tmp, "d7"),
		},
		{
			name:      "pprof address without a port",
			args:      []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d8"), "--pprof", "6060"},
			want:      "oncegate: pprof 6060: address 6060: missing port in address" + pprofHint,
			untouched: filepath.Join(tmp, "d8"),
		},
		{
			name:      "pprof port taken",
			args:      []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d9"), "--pprof", pprofBusy},
			want:      "oncegate: pprof listen " + pprofBusy + ": address already in use" + pprofHint,
			untouched: filepath.Join(tmp, "d9"),
		},
		{
			name:      "api role on an embedded NATS without a port",
			args:      []string{"serve", "--role", "api", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "d3")},
			want:      `oncegate: role: "api" runs no workers and the embedded NATS server has no network port, so no worker could ever connect: pass --nats-listen ADDR (nats.listen) or --nats-url URL (nats.url)`,
			untouched: filepath.Join(tmp, "d3"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runOncegate(t, tc.args...)
			if code != 1 || stderr != tc.want+"\n" {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and the one line:\n%s", code, stderr, tc.want)
			}
			if tc.untouched != "" {
				if _, err := os.Stat(tc.untouched); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after the failed start (%v): it must fail before the store", tc.untouched, err)
				}
			}
		})
	}
}

// TestServeSecondProcessOnDataDir: while one gateway runs on a data dir, a second gateway and
// the ledger CLI on that dir are refused, naming the first one's pid; once the first has
// stopped, the ledger CLI opens the dir.
func TestServeSecondProcessOnDataDir(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	addr := testkit.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := oncegateCmd(ctx, t, "serve", "--listen", addr, "--data-dir", dataDir)
	firstLog := &testkit.SyncBuffer{}
	first.Stderr = firstLog
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- first.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = first.Process.Signal(syscall.SIGTERM)
		if err := <-waited; err != nil {
			t.Errorf("first gateway: %v\n%s", err, firstLog.String())
		}
	}
	defer stop()

	waitReady(t, addr, firstLog.String)

	pid := "pid " + strconv.Itoa(first.Process.Pid)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"second gateway", []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir},
			[]string{"oncegate: data dir " + dataDir + " is in use by oncegate " + pid + " ", "stop it, or pass another --data-dir"}},
		{"ledger CLI", []string{"ledger", "bill", "--data-dir", dataDir},
			[]string{"oncegate ledger bill: ", " is in use by oncegate " + pid + " "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runOncegate(t, tc.args...)
			ok := code != 0 && strings.Count(stderr, "\n") == 1 && !strings.Contains(stderr, "panic")
			for _, w := range tc.want {
				ok = ok && strings.Contains(stderr, w)
			}
			if !ok {
				t.Errorf("exit %d, stderr:\n%s\nwant a non-zero exit and one line with %q", code, stderr, tc.want)
			}
		})
	}

	stop()
	if code, stderr := runOncegate(t, "ledger", "bill", "--data-dir", dataDir); code != 0 {
		t.Errorf("ledger bill after the gateway stopped: exit %d, stderr:\n%s", code, stderr)
	}
}
