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
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
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
// asked. Two tests asking at the same moment could still draw the same port (one in about
// twelve thousand); where no such port is free, it falls back to one the kernel picks.
func Addr(t testing.TB) string {
	t.Helper()
	lo, hi := floor, ephemeralLow()
	for range attempts {
		if hi <= lo {
			break
		}
		addr := fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo))
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
