package testkit

import (
	"context"
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
