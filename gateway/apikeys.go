package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/httpapi"
	"github.com/oncegate/oncegate/kv"
)

// startKeys opens the run-time API keys bucket and keeps this node's copy of it (a watcher
// that runs until Stop). It returns once the copy holds every key the bucket held, so the
// API never serves with a revocation it has not seen yet.
func (g *Gateway) startKeys(ctx context.Context, js jetstream.JetStream) (httpapi.KeyStore, error) {
	var keys *kv.APIKeys
	if err := openRetried(ctx, g.log, "API keys", clusterSetupWindow, func(ctx context.Context) (err error) {
		keys, err = kv.OpenAPIKeys(ctx, js, g.res.replicas)
		return err
	}); err != nil {
		return nil, err
	}
	loaded := make(chan struct{})
	g.keys = startLoop(ctx, func(ctx context.Context) {
		for ctx.Err() == nil {
			err := keys.Watch(ctx, func() { closeOnce(loaded) })
			if ctx.Err() != nil {
				return
			}
			g.log.Warn().Err(err).Msg("run-time API keys: watcher stopped; restarting")
			select { // a watcher that cannot start (an election) is tried again, not in a spin
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	select {
	case <-loaded:
		return apiKeys{keys: keys, now: time.Now}, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("run-time API keys: the bucket %s was not read before the start's deadline: %w", kv.APIKeysBucket, ctx.Err())
	}
}

// closeOnce closes ch unless it is closed already (a restarted watcher loads again).
func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// apiKeys adapts kv.APIKeys to httpapi.KeyStore (httpapi imports no store).
type apiKeys struct {
	keys *kv.APIKeys
	now  func() time.Time
}

func (a apiKeys) Lookup(hash string) (httpapi.RuntimeKey, bool) {
	k, ok := a.keys.Lookup(hash)
	return runtimeKey(k), ok
}

func (a apiKeys) Add(ctx context.Context, tenant, hash string) (httpapi.RuntimeKey, error) {
	k, err := a.keys.Add(ctx, tenant, hash, a.now())
	return runtimeKey(k), keyError(err)
}

func (a apiKeys) Revoke(ctx context.Context, hash, tenant string) (httpapi.RuntimeKey, error) {
	k, err := a.keys.Revoke(ctx, hash, tenant, a.now())
	return runtimeKey(k), keyError(err)
}

func (a apiKeys) List(ctx context.Context) ([]httpapi.RuntimeKey, error) {
	ks, err := a.keys.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]httpapi.RuntimeKey, len(ks))
	for i, k := range ks {
		out[i] = runtimeKey(k)
	}
	return out, nil
}

func runtimeKey(k kv.APIKey) httpapi.RuntimeKey {
	return httpapi.RuntimeKey{Hash: k.Hash, Tenant: k.Tenant, Created: k.Created, Revoked: k.Revoked}
}

// keyError maps the store's errors to the API's (err unchanged otherwise).
func keyError(err error) error {
	switch {
	case errors.Is(err, kv.ErrKeyTenant):
		return fmt.Errorf("%w: %w", httpapi.ErrKeyOtherTenant, err)
	case errors.Is(err, kv.ErrKeyRevoked):
		return fmt.Errorf("%w: %w", httpapi.ErrKeyWasRevoked, err)
	case errors.Is(err, kv.ErrNotFound):
		return fmt.Errorf("%w: %w", httpapi.ErrKeyUnknown, err)
	}
	return err
}
