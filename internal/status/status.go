// Package status is the board where every worker process posts the health of its backends
// (circuit breakers, retry budgets), so any API node can show it: a JetStream key-value bucket
// in memory, one key per worker, expiring when a worker stops posting. Safe for concurrent use.
//
// A live entry is also the API's proof that some worker consumes the JOBS queue: /readyz is
// false while the board is empty.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/replicas"
)

// Bucket is the name of the status bucket.
const Bucket = "STATUS"

// Board is the status bucket.
type Board struct {
	kv jetstream.KeyValue
}

// Stream is the stream behind the bucket.
const Stream = "KV_" + Bucket

// Open creates or updates the bucket with n replicas (an existing bucket keeps its count when
// larger); a worker's entry expires ttl after its last post. It is also how a gateway
// recreates the bucket after a NATS restart lost it (memory storage). Replicated, the board
// survives one server's loss: every API node's /readyz reads it.
func Open(ctx context.Context, js jetstream.JetStream, ttl time.Duration, n int) (*Board, error) {
	kvs, err := replicas.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket: Bucket, History: 1, TTL: ttl, Storage: jetstream.MemoryStorage, Replicas: n,
	})
	if err != nil {
		return nil, fmt.Errorf("status: open: %w", err)
	}
	return &Board{kv: kvs}, nil
}

// Post replaces worker's entry with v (JSON).
func (b *Board) Post(ctx context.Context, worker string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("status: encode: %w", err)
	}
	if _, err := b.kv.Put(ctx, worker, data); err != nil {
		return fmt.Errorf("status: post %s: %w", worker, err)
	}
	return nil
}

// Remove deletes worker's entry, so a worker that stops cleanly is gone from the board at
// once rather than when its entry expires.
func (b *Board) Remove(ctx context.Context, worker string) error {
	if err := b.kv.Delete(ctx, worker); err != nil {
		return fmt.Errorf("status: remove %s: %w", worker, err)
	}
	return nil
}

// Read returns every live worker's entry.
func (b *Board) Read(ctx context.Context) (map[string]json.RawMessage, error) {
	keys, err := b.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return map[string]json.RawMessage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status: keys: %w", err)
	}
	out := make(map[string]json.RawMessage, len(keys))
	for _, k := range keys {
		e, err := b.kv.Get(ctx, k)
		if err != nil {
			continue // expired between the listing and the read
		}
		out[k] = json.RawMessage(e.Value())
	}
	return out, nil
}
