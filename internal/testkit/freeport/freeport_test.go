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
