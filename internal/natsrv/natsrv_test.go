package natsrv

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func startCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestStoreLock: while one server runs on a store directory a second one is refused with the
// holder's pid, and the directory is free again once the first has shut down. flock(2) locks
// belong to the open file, so two opens in one process conflict like two processes do
// (cmd/oncegate's TestServeSecondProcessOnDataDir checks real processes).
func TestStoreLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "jetstream")
	first, err := Start(startCtx(t), Options{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { first.Shutdown() }()

	_, err = Start(startCtx(t), Options{StoreDir: dir, ServerName: "oncegate-ledger-cli"})
	var le *LockedError
	if !errors.Is(err, ErrLocked) || !errors.As(err, &le) {
		t.Fatalf("second server on the same store: %v, want ErrLocked", err)
	}
	host, _ := os.Hostname()
	if le.Holder.PID != os.Getpid() || le.Holder.Host != host || le.Holder.Name != "oncegate" || le.Holder.Started.IsZero() {
		t.Errorf("holder %+v, want pid %d host %s name oncegate and a start time", le.Holder, os.Getpid(), host)
	}

	first.Shutdown()
	again, err := Start(startCtx(t), Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("after the holder stopped: %v", err)
	}
	first = again
}

// TestStartUnusableStore: a store directory that cannot be created fails at once with
// ErrStoreDir naming the path, not with "not ready" after the deadline.
func TestStartUnusableStore(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, dir string }{
		{"store is a file", file},
		{"store under a file", filepath.Join(file, "jetstream")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Start(startCtx(t), Options{StoreDir: tc.dir})
			if !errors.Is(err, ErrStoreDir) || !errors.Is(err, syscall.ENOTDIR) && !errors.Is(err, syscall.EEXIST) {
				t.Fatalf("err %v, want ErrStoreDir (not a directory)", err)
			}
		})
	}
}

// TestStartBusyListen: a taken --nats-listen port is reported as ErrListen with the system's
// reason (the server says so only through its logger), and the lock is released.
func TestStartBusyListen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	_, err = Start(startCtx(t), Options{StoreDir: dir, Listen: ln.Addr().String()})
	if !errors.Is(err, ErrListen) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err %v, want ErrListen (address already in use)", err)
	}
	ns, err := Start(startCtx(t), Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("the failed start kept the lock: %v", err)
	}
	ns.Shutdown()
}

// TestListenPortZero: port 0 is any free port, as for net.Listen (nats-server alone would read
// it as 4222), so two servers with ":0" both start.
func TestListenPortZero(t *testing.T) {
	var urls []string
	for range 2 {
		ns, err := Start(startCtx(t), Options{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Shutdown()
		urls = append(urls, ns.ClientURL())
	}
	if urls[0] == urls[1] || urls[0] == "nats://127.0.0.1:4222" {
		t.Errorf("client URLs %v, want two distinct free ports", urls)
	}
}
