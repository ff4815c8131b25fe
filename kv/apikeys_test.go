package kv_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// openAPIKeys is the key store on a fresh embedded JetStream, and a context for the test.
func openAPIKeys(t *testing.T) (context.Context, *kv.APIKeys) {
	t.Helper()
	srv := testkit.RunJetStream(t, 0)
	_, js := srv.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	keys, err := kv.OpenAPIKeys(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, keys
}

// TestAPIKeysStore: the store's answers on a real JetStream, each step on the state the
// steps before left, and this node's watched copy following every write.
func TestAPIKeysStore(t *testing.T) {
	ctx, keys := openAPIKeys(t)
	loaded := make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- keys.Watch(wctx, func() { close(loaded) }) }()
	defer func() {
		stop()
		if err := testkit.RequireChanRead(t, done, 5*time.Second); err != nil {
			t.Errorf("watch: %v", err)
		}
	}()
	testkit.RequireChanRead(t, loaded, 5*time.Second)

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := keyHash("key-a"), keyHash("key-b")
	steps := []struct {
		name    string
		do      func() (kv.APIKey, error)
		wantErr error
		// the watched copy of a afterwards: absent, valid or revoked, and its tenant
		wantCopy string
	}{
		{"a malformed hash", func() (kv.APIKey, error) { return keys.Add(ctx, "acme", "ABC", now) }, kv.ErrKeyHash, "absent"},
		{"an upper-case hash", func() (kv.APIKey, error) { return keys.Add(ctx, "acme", "A"+a[1:], now) }, kv.ErrKeyHash, "absent"},
		{"revoke a hash nobody has, no tenant", func() (kv.APIKey, error) { return keys.Revoke(ctx, a, "", now) }, kv.ErrNotFound, "absent"},
		{"add", func() (kv.APIKey, error) { return keys.Add(ctx, "acme", a, now) }, nil, "valid acme"},
		{"add again, same tenant", func() (kv.APIKey, error) { return keys.Add(ctx, "acme", a, now.Add(time.Hour)) }, nil, "valid acme"},
		{"add it for another tenant", func() (kv.APIKey, error) { return keys.Add(ctx, "other", a, now) }, kv.ErrKeyTenant, "valid acme"},
		{"revoke", func() (kv.APIKey, error) { return keys.Revoke(ctx, a, "", now.Add(time.Minute)) }, nil, "revoked acme"},
		{"revoke again", func() (kv.APIKey, error) { return keys.Revoke(ctx, a, "", now.Add(time.Hour)) }, nil, "revoked acme"},
		{"add the revoked key back", func() (kv.APIKey, error) { return keys.Add(ctx, "acme", a, now) }, kv.ErrKeyRevoked, "revoked acme"},
		{"revoke a configured key (not stored)", func() (kv.APIKey, error) { return keys.Revoke(ctx, b, "beta", now.Add(2*time.Hour)) }, nil, "revoked acme"},
	}
	for _, st := range steps {
		_, err := st.do()
		if !errors.Is(err, st.wantErr) {
			t.Fatalf("%s: err %v, want %v", st.name, err, st.wantErr)
		}
		testkit.CheckFor(t, 2*time.Second, 5*time.Millisecond, func() error {
			k, found := keys.Lookup(a)
			got := "absent"
			switch {
			case found && k.Revoked.IsZero():
				got = "valid " + k.Tenant
			case found:
				got = "revoked " + k.Tenant
			}
			if got != st.wantCopy {
				return fmt.Errorf("%s: the copy of a is %q, want %q", st.name, got, st.wantCopy)
			}
			return nil
		})
	}
	list, err := keys.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Hash != a || !list[0].Created.Equal(now) || !list[0].Revoked.Equal(now.Add(time.Minute)) ||
		list[1].Hash != b || list[1].Tenant != "beta" || list[1].Revoked.IsZero() {
		t.Errorf("list = %+v; want a (created at %s, revoked a minute later), then b of beta, revoked", list, now)
	}
}

// TestAPIKeysReadYourWrites: the node that adds or revokes a key acts on it at once, before its
// watch delivers the write (here no watch runs at all): TestKeyAdminCommands' request with a
// key just added was refused 401 when it came before the watch's delivery.
func TestAPIKeysReadYourWrites(t *testing.T) {
	ctx, keys := openAPIKeys(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := keyHash("key-a")
	if _, err := keys.Add(ctx, "acme", a, now); err != nil {
		t.Fatal(err)
	}
	if k, found := keys.Lookup(a); !found || !k.Revoked.IsZero() || k.Tenant != "acme" {
		t.Fatalf("right after the add: %+v found %v, want a valid key of acme", k, found)
	}
	if _, err := keys.Revoke(ctx, a, "", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if k, found := keys.Lookup(a); !found || k.Revoked.IsZero() {
		t.Fatalf("right after the revocation: %+v found %v, want it revoked", k, found)
	}
	// An add that finds the key revoked never puts it back as valid.
	if _, err := keys.Add(ctx, "acme", a, now); !errors.Is(err, kv.ErrKeyRevoked) {
		t.Fatalf("add after the revocation: %v, want ErrKeyRevoked", err)
	}
	if k, _ := keys.Lookup(a); k.Revoked.IsZero() {
		t.Fatal("the revoked key is valid again in the copy")
	}
}
