package testkit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/natsrv"
)

// JetStream is a running single test server with one connection.
type JetStream struct {
	*natsrv.Server
	NC *nats.Conn
	JS jetstream.JetStream
}

// RunJetStream starts a real embedded nats-server with JetStream in a temporary directory
// (in-process, no network port, ~2 ms; SyncInterval as given, 0 = synced writes), connects to
// it, and stops both at cleanup.
func RunJetStream(t testing.TB, syncInterval time.Duration) *JetStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := natsrv.Start(ctx, natsrv.Options{StoreDir: t.TempDir(), SyncInterval: syncInterval})
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	nc, err := ns.Connect("test")
	if err != nil {
		ns.Shutdown()
		t.Fatalf("testkit: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		ns.Shutdown()
		t.Fatalf("testkit: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		ns.Shutdown()
	})
	return &JetStream{Server: ns, NC: nc, JS: js}
}

// Conn opens another connection, closed at cleanup.
func (s *JetStream) Conn(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := s.Connect("test-extra")
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

// Recreate runs create, which makes a stream again right after the test deleted it, until it
// no longer fails with "error creating store for stream" (for at most 5 s), and fails the test
// on any other error. nats-server removes an account's emptied streams directory in a goroutine
// of its own after a delete (stream.go, stop with deleteFlag): a create in that moment can lose
// the directory it just made. Only a test deletes the last stream of an account and at once
// makes one again.
func Recreate(t testing.TB, create func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := create()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "error creating store for stream") || time.Now().After(deadline) {
			t.Fatalf("testkit: recreate: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
