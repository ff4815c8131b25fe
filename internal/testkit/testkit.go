// Package testkit is the one kit the repository's tests share: real NATS (RunJetStream, a
// single embedded server; RunCluster, three clustered ones), CheckFor instead of hand-written
// poll loops, RequireChanRead/RequireNoChanRead, Golden with one -update flag, a free loopback
// address and a buffer safe for concurrent writers. It is imported by tests only, and imports
// no project room (only the embedded-server leaf internal/natsrv), so any package's tests,
// internal or external, can use it. Starting a whole gateway needs the composition root and
// lives in the sub-package gatewaykit.
package testkit

import (
	"bytes"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit/freeport"
)

// FreeAddr returns a 127.0.0.1 address whose port was free when asked, for a process that
// binds it soon after; the port is outside the kernel's ephemeral range, so no outgoing
// connection takes it meanwhile (see package freeport).
func FreeAddr(t testing.TB) string {
	t.Helper()
	return freeport.Addr(t)
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: an exec.Cmd's output copier, or a
// logger's goroutines, write while the test reads.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Watch subscribes nc to subject and returns what arrives there: a core subscriber sees every
// try of a write or an API request sent to that subject, applied or not (and, never
// answering, makes each one wait for its deadline rather than get "no responders").
func Watch(t testing.TB, nc *nats.Conn, subject string) <-chan *nats.Msg {
	t.Helper()
	tries := make(chan *nats.Msg, 256)
	if _, err := nc.ChanSubscribe(subject, tries); err != nil {
		t.Fatalf("testkit: watch %s: %v", subject, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("testkit: watch %s: %v", subject, err)
	}
	return tries
}
