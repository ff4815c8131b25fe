package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestAddrOutsideEphemeralRange: the port is below the kernel's ephemeral range (where no
// outgoing connection takes it) and can be bound.
func TestAddrOutsideEphemeralRange(t *testing.T) {
	for range 20 {
		addr := Addr(t)
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < floor || port >= ephemeralLow() {
			t.Fatalf("port %d, want in [%d, %d)", port, floor, ephemeralLow())
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("bind %s: %v", addr, err)
		}
		ln.Close()
	}
}

// TestAddrNeverTwiceWhileHeld: ports handed out and still held by their tests are never
// handed out again, in this process or (through the lock files) another; a port is free
// again once its test ends.
func TestAddrNeverTwiceWhileHeld(t *testing.T) {
	const draws = 2000 // a sixth of the range: a plain random draw repeats with near certainty
	seen := make(map[string]bool, draws)
	for range draws {
		addr := Addr(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice while held", addr)
		}
		seen[addr] = true
	}
	var held string
	for a := range seen {
		held = a
		break
	}
	_, p, _ := net.SplitHostPort(held)
	port, _ := strconv.Atoi(p)
	dir, err := lockDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(dir, port); err == nil {
		t.Fatalf("port %d reservable while its test holds it", port)
	}

	var released string
	t.Run("ends", func(t *testing.T) { released = Addr(t) })
	_, p, _ = net.SplitHostPort(released)
	port, _ = strconv.Atoi(p)
	lock, err := reserve(dir, port)
	if err != nil {
		t.Fatalf("port %d still reserved after its test ended: %v", port, err)
	}
	lock.Close()
}
