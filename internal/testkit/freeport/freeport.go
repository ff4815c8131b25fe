// Package freeport finds loopback ports for servers a test starts a moment later (a NATS
// route port every node must name before any node starts, a process's --listen).
//
// A port the kernel picks for a listener on port 0 comes from the ephemeral range, the same
// range every outgoing connection's local port comes from: once the finder closes its
// listener, a client connecting anywhere on the machine (another test package's NATS client,
// under go test's parallel packages) can take the port before the server binds it. CI saw
// exactly that ("cluster listen 127.0.0.1:37693: bind: address already in use"). Ports below
// the ephemeral range are never handed to outgoing connections, so Addr picks one there at
// random and checks it can be bound.
//
// A port is free when asked, but nothing is bound to it until the server starts, so two
// draws could return the same port: a three-node cluster draws about twenty, and CI saw one
// server's monitor port taken by a sibling's ("can't listen to the monitor port: bind:
// address already in use"). Each returned port is therefore reserved until the test ends by
// an exclusive lock on a file named after it, which every test process on the machine
// honours and which the kernel drops if the process dies.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const (
	// floor is the lowest port Addr picks: above the registered ports most services use.
	floor = 20000
	// defaultEphemeralLow is Linux's default start of the ephemeral range.
	defaultEphemeralLow = 32768
	attempts            = 200
)

// Addr returns "127.0.0.1:port" for a port outside the ephemeral range that was free when
// asked and that no other Addr on the machine returns until t ends; where no such port is
// free, it falls back to one the kernel picks.
func Addr(t testing.TB) string {
	t.Helper()
	dir, err := lockDir()
	if err != nil {
		t.Fatalf("freeport: %v", err)
	}
	lo, hi := floor, ephemeralLow()
	for range attempts {
		if hi <= lo {
			break
		}
		port := lo + rand.IntN(hi-lo)
		lock, err := reserve(dir, port)
		if errors.Is(err, errReserved) {
			continue
		}
		if err != nil {
			t.Fatalf("freeport: %v", err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			t.Cleanup(func() { lock.Close() })
			return addr
		}
		lock.Close()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// errReserved: another Addr (in this process or another) holds the port.
var errReserved = errors.New("port reserved")

// lockDir is the directory of the per-port lock files, shared by every test process.
func lockDir() (string, error) {
	dir := filepath.Join(os.TempDir(), "oncegate-freeport")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("lock directory: %w", err)
	}
	return dir, nil
}

// reserve takes the exclusive lock of port's file, or returns errReserved. flock locks
// belong to the open file, so a second open in the same process conflicts too.
func reserve(dir string, port int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o600) // #nosec G304 -- a port number under our own lock directory
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errReserved
		}
		return nil, fmt.Errorf("lock %d: %w", port, err)
	}
	return f, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeralLow
	}
	var low, high int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &low, &high); err != nil || low <= 0 {
		return defaultEphemeralLow
	}
	return low
}
