package dashboard

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/replicas"
)

// Bucket is the key-value bucket of the snapshots: one key per process.
const Bucket = "DASHBOARD"

// SnapshotTTL is how long a process's snapshot outlives its last post (bucket TTL, and the
// age past which Aggregate leaves a snapshot out).
const SnapshotTTL = 5 * time.Second

// Open creates or updates the bucket (memory storage, n replicas, an existing bucket keeps a
// larger count). It is also how a process recreates it after a NATS restart lost it.
func Open(ctx context.Context, js jetstream.JetStream, n int) (jetstream.KeyValue, error) {
	kv, err := replicas.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, TTL: SnapshotTTL, Storage: jetstream.MemoryStorage, Replicas: n,
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: open: %w", err)
	}
	return kv, nil
}

// nodeKey is a process name as a key of the bucket: anything outside [A-Za-z0-9_-] becomes _.
func nodeKey(node string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, node)
}
