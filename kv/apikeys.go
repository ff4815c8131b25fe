package kv

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/replicas"
)

// API keys managed at run time (issue 37): tenants' keys added and revoked while the gateway
// runs, in the APIKEYS bucket, beside the ones in the configuration. An entry is keyed by the
// key's SHA-256 (hex): the key itself is never stored. A revoked key keeps its entry, marked
// Revoked, for good: a revocation is a fact every node must keep, and it also refuses a key
// that is still in the configuration (revocation wins over any other positive answer).
//
// Every API node keeps the bucket's entries in memory through a watcher (WatchAPIKeys), so an
// authentication reads no store, and an entry written on any node takes effect on every node
// as fast as the bucket's stream delivers it (milliseconds on a healthy cluster), and on the
// node that wrote it before the write returns (learn).

// APIKeysBucket is the name of the run-time API keys bucket; APIKeysStream is its stream.
const (
	APIKeysBucket = "APIKEYS"
	APIKeysStream = "KV_" + APIKeysBucket
)

// Errors of the key store.
var (
	// ErrKeyHash: the hash given is not 64 lower-case hex digits (a SHA-256).
	ErrKeyHash = errors.New("kv: an API key hash is 64 lower-case hex digits (SHA-256)")
	// ErrKeyTenant: the hash is already a key of another tenant.
	ErrKeyTenant = errors.New("kv: this API key belongs to another tenant")
	// ErrKeyRevoked: the key was revoked; a revoked key is never made valid again.
	ErrKeyRevoked = errors.New("kv: this API key was revoked")
)

// APIKey is one run-time key's entry.
type APIKey struct {
	// Hash is the hex SHA-256 of the key (the entry's key in the bucket).
	Hash    string    `json:"-"`
	Tenant  string    `json:"tenant"`
	Created time.Time `json:"created"`
	// Revoked is when the key was revoked; zero while it is valid.
	Revoked time.Time `json:"revoked,omitzero"`
}

// APIKeys is the run-time key store, and this node's copy of it (kept by Watch). It is safe
// for concurrent use.
type APIKeys struct {
	kv jetstream.KeyValue

	mu   sync.RWMutex
	keys map[string]APIKey // by hash
}

// OpenAPIKeys creates or updates the bucket (file storage, replicas as the other buckets: it
// holds what authenticates every request).
func OpenAPIKeys(ctx context.Context, js jetstream.JetStream, replicaCount int) (*APIKeys, error) {
	kvs, err := replicas.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:   APIKeysBucket,
		History:  1,
		Storage:  jetstream.FileStorage,
		Replicas: replicaCount,
	})
	if err != nil {
		return nil, fmt.Errorf("kv: open bucket %s: %w", APIKeysBucket, err)
	}
	return &APIKeys{kv: kvs, keys: map[string]APIKey{}}, nil
}

// ValidKeyHash reports whether h is a SHA-256 in lower-case hex.
func ValidKeyHash(h string) bool {
	if len(h) != 64 || strings.ToLower(h) != h {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// Watch keeps this node's copy of the keys until ctx ends. It calls loaded (nil: none) once
// every entry the bucket held when it started is in the copy. An entry that cannot be read
// is kept as revoked: a key is never let in on a value the node does not understand.
func (k *APIKeys) Watch(ctx context.Context, loaded func()) error {
	w, err := k.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("kv: watch %s: %w", APIKeysBucket, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil { // the initial values are all in
				if loaded != nil {
					loaded()
					loaded = nil
				}
				continue
			}
			k.apply(e)
		}
	}
}

// apply puts one watched entry in the copy.
func (k *APIKeys) apply(e jetstream.KeyValueEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		// Entries are never deleted by the gateway; one deleted by hand is not let in either.
		if old, ok := k.keys[e.Key()]; ok && old.Revoked.IsZero() {
			old.Revoked = e.Created()
			k.keys[e.Key()] = old
		}
		return
	}
	key, err := decodeAPIKey(e.Key(), e.Value())
	if err != nil {
		key = APIKey{Hash: e.Key(), Revoked: e.Created()}
	}
	k.keys[e.Key()] = key
}

func decodeAPIKey(hash string, data []byte) (APIKey, error) {
	var key APIKey
	if err := json.Unmarshal(data, &key); err != nil {
		return APIKey{}, err
	}
	key.Hash = hash
	return key, nil
}

// learn puts an entry this node has just written in its copy, so that the node that answered
// an add or a revoke acts on it at once instead of when its watch delivers the write (a
// request with the new key right after the add was refused 401 in between). A revocation
// replaces whatever the copy holds (it is final); an added key only fills an empty place: the
// watch may already have delivered it, or its revocation.
func (k *APIKeys) learn(key APIKey, revoked bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.keys[key.Hash]; ok && !revoked {
		return
	}
	k.keys[key.Hash] = key
}

// Lookup is this node's copy of the entry of hash (found: it has one, valid or revoked).
func (k *APIKeys) Lookup(hash string) (key APIKey, found bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	key, found = k.keys[hash]
	return key, found
}

// Add stores hash as a key of tenant. Adding a key the tenant already has changes nothing and
// returns its entry; ErrKeyTenant if another tenant has it, ErrKeyRevoked if it was revoked.
func (k *APIKeys) Add(ctx context.Context, tenant, hash string, now time.Time) (APIKey, error) {
	if !ValidKeyHash(hash) {
		return APIKey{}, ErrKeyHash
	}
	key := APIKey{Hash: hash, Tenant: tenant, Created: now.UTC()}
	data, err := json.Marshal(key)
	if err != nil {
		return APIKey{}, fmt.Errorf("kv: add key: %w", err)
	}
	_, err = k.kv.Create(ctx, hash, data)
	if err == nil {
		k.learn(key, false)
		return key, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return APIKey{}, fmt.Errorf("kv: add key %s: %w", hash, err)
	}
	have, _, err := k.get(ctx, hash)
	switch {
	case err != nil:
		return APIKey{}, err
	case !have.Revoked.IsZero():
		return have, ErrKeyRevoked
	case have.Tenant != tenant:
		return APIKey{}, ErrKeyTenant
	}
	return have, nil
}

// Revoke marks hash revoked, for every node. A hash the bucket does not hold gets a revoked
// entry of tenant (a key of the configuration), or ErrNotFound when tenant is "". Revoking a
// revoked key changes nothing.
func (k *APIKeys) Revoke(ctx context.Context, hash, tenant string, now time.Time) (APIKey, error) {
	if !ValidKeyHash(hash) {
		return APIKey{}, ErrKeyHash
	}
	for range 5 { // compare-and-set; another writer in between means read again
		have, rev, err := k.get(ctx, hash)
		switch {
		case errors.Is(err, ErrNotFound) && tenant == "":
			return APIKey{}, fmt.Errorf("kv: revoke key %s: %w", hash, ErrNotFound)
		case errors.Is(err, ErrNotFound):
			have = APIKey{Hash: hash, Tenant: tenant, Created: now.UTC()}
		case err != nil:
			return APIKey{}, err
		case !have.Revoked.IsZero():
			return have, nil
		}
		have.Revoked = now.UTC()
		data, err := json.Marshal(have)
		if err != nil {
			return APIKey{}, fmt.Errorf("kv: revoke key: %w", err)
		}
		if rev == 0 {
			_, err = k.kv.Create(ctx, hash, data)
		} else {
			_, err = k.kv.Update(ctx, hash, data, rev)
		}
		if casLost(err) {
			continue
		}
		if err != nil {
			return APIKey{}, fmt.Errorf("kv: revoke key %s: %w", hash, err)
		}
		k.learn(have, true)
		return have, nil
	}
	return APIKey{}, fmt.Errorf("kv: revoke key %s: %w", hash, ErrConflict)
}

// List reads every entry from the bucket (not this node's copy), oldest first.
func (k *APIKeys) List(ctx context.Context) ([]APIKey, error) {
	lister, err := k.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("kv: list keys: %w", err)
	}
	defer lister.Stop()
	var out []APIKey
	for hash := range lister.Keys() {
		key, _, err := k.get(ctx, hash)
		if errors.Is(err, ErrNotFound) {
			continue // deleted in between
		}
		if err != nil {
			return nil, err
		}
		out = append(out, key)
	}
	slices.SortFunc(out, func(a, b APIKey) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Hash, b.Hash)
	})
	return out, nil
}

// get reads hash's entry and revision from the bucket; ErrNotFound if none.
func (k *APIKeys) get(ctx context.Context, hash string) (APIKey, uint64, error) {
	e, err := k.kv.Get(ctx, hash)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return APIKey{}, 0, ErrNotFound
	}
	if err != nil {
		return APIKey{}, 0, fmt.Errorf("kv: read key %s: %w", hash, err)
	}
	key, err := decodeAPIKey(hash, e.Value())
	if err != nil {
		return APIKey{}, 0, fmt.Errorf("kv: decode key %s: %w", hash, err)
	}
	return key, e.Revision(), nil
}
