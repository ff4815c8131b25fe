// Package lb is a TCP load balancer for tests, shaped like the one users put in front of a
// cluster (haproxy in TCP mode, round robin, "retry on connect errors only"): each accepted
// connection goes to the next backend in turn; when that backend refuses the connection (its
// process is dead), the next one is tried, and only when every backend refuses is the client's
// connection closed. Bytes are never replayed: a connection that was established and then
// broke stays broken, as an HTTP request sent to a node that died is the client's to retry.
//
// A Balancer owns one accept goroutine and two copy goroutines per connection; Close stops them
// all and waits for them.
package lb

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// dialTimeout bounds one connect attempt to a backend (a dead process on loopback refuses at
// once; this is for one that hangs).
const dialTimeout = time.Second

// Balancer is a running balancer.
type Balancer struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	// Refused counts connect attempts a backend refused (each was retried on the next one).
	Refused atomic.Int64
	// Dropped counts client connections closed because every backend refused.
	Dropped atomic.Int64
}

// Start listens on a free 127.0.0.1 port in front of backends (host:port) and stops at the
// test's cleanup.
func Start(t testing.TB, backends ...string) *Balancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("lb: %v", err)
	}
	b := &Balancer{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(b.Close)
	return b
}

// Addr is the balancer's host:port.
func (b *Balancer) Addr() string { return b.ln.Addr().String() }

// URL is the balancer's http:// base URL.
func (b *Balancer) URL() string { return "http://" + b.Addr() }

// Close stops accepting, closes every connection and waits for the goroutines.
func (b *Balancer) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	_ = b.ln.Close()
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *Balancer) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return // closed
		}
		if !b.track(c) {
			_ = c.Close()
			return
		}
		b.wg.Add(1)
		go b.serve(c)
	}
}

// track registers c for Close; false once closed.
func (b *Balancer) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *Balancer) untrack(cs ...net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		delete(b.conns, c)
		_ = c.Close()
	}
}

// serve connects client to the next backend that accepts, then copies both ways until
// either side ends.
func (b *Balancer) serve(client net.Conn) {
	defer b.wg.Done()
	upstream := b.dial()
	if upstream == nil {
		b.Dropped.Add(1)
		b.untrack(client)
		return
	}
	if !b.track(upstream) {
		b.untrack(client, upstream)
		return
	}
	var once sync.Once
	done := func() { once.Do(func() { b.untrack(client, upstream) }) }
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		pipe(upstream, client)
		done()
	}()
	pipe(client, upstream)
	done()
}

// dial connects to the backends in round-robin order, moving on only past those that refuse.
func (b *Balancer) dial() net.Conn {
	start := b.next.Add(1)
	for i := range b.backends {
		addr := b.backends[(int(start)+i)%len(b.backends)]
		c, err := net.DialTimeout("tcp", addr, dialTimeout)
		if err == nil {
			return c
		}
		b.Refused.Add(1)
	}
	return nil
}

// pipe copies src to dst until either side fails or ends; serve then closes both.
func pipe(dst, src net.Conn) { _, _ = io.Copy(dst, src) }
