package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
)

// KeyStore is the run-time API key store (docs/operations/api-keys.md): tenants' keys added
// and revoked while the gateway runs, by SHA-256, kept in a replicated bucket that every node
// watches. The gateway passes it in (adapting kv.APIKeys); nil: keys come from the
// configuration only, and /v1/admin/keys does not exist.
type KeyStore interface {
	// Lookup is this node's copy of hash's entry (found false: the store has none). It reads
	// no store: authentication costs no round trip.
	Lookup(hash string) (key RuntimeKey, found bool)
	// Add stores hash as a key of tenant; adding it again for the same tenant changes nothing.
	// ErrKeyOtherTenant, ErrKeyWasRevoked.
	Add(ctx context.Context, tenant, hash string) (RuntimeKey, error)
	// Revoke marks hash revoked on every node; revoking twice changes nothing. tenant names
	// a key of the configuration, which the store may not hold yet; with tenant "", a hash
	// the store does not hold is ErrKeyUnknown.
	Revoke(ctx context.Context, hash, tenant string) (RuntimeKey, error)
	// List reads every entry from the store.
	List(ctx context.Context) ([]RuntimeKey, error)
}

// RuntimeKey is one key's entry, as /v1/admin/keys shows it.
type RuntimeKey struct {
	Hash    string    `json:"sha256"`
	Tenant  string    `json:"tenant"`
	Source  string    `json:"source"` // "runtime" (the store) or "config" (tenants[].api_keys_sha256)
	Created time.Time `json:"created,omitzero"`
	Revoked time.Time `json:"revoked,omitzero"`
}

// Errors of the key store, which its adapter returns (wrapped) for the error table.
var (
	// ErrKeyOtherTenant: the key is already another tenant's.
	ErrKeyOtherTenant = errors.New("httpapi: this API key belongs to another tenant")
	// ErrKeyWasRevoked: the key was revoked, and a revoked key is never valid again.
	ErrKeyWasRevoked = errors.New("httpapi: this API key was revoked")
	// ErrKeyUnknown: no key has this hash.
	ErrKeyUnknown = errors.New("httpapi: no key has this hash")
)

var (
	errKeyAdminBody   = errors.New("httpapi: the body must be {\"tenant\": ..., \"sha256\": ...}")
	errKeyAdminTenant = errors.New("httpapi: no configured tenant has this id")
	errKeyAdminHash   = errors.New("httpapi: sha256 must be 64 lower-case hex digits")
)

func (s *Server) routesKeys(r fiber.Router) {
	r.Get("/admin/keys", s.listKeys)
	r.Post("/admin/keys", s.addKey)
	r.Delete("/admin/keys/:hash", s.revokeKey)
}

// authenticateKeyAdmin: the key admin API exists with an admin key and a key store.
func (s *Server) authenticateKeyAdmin(c *fiber.Ctx) error {
	return s.admitAdmin(c, s.keys != nil)
}

// validKeyHash reports whether h is a SHA-256 in lower-case hex.
func validKeyHash(h string) bool {
	_, err := hex.DecodeString(h)
	return err == nil && len(h) == 2*sha256.Size && strings.ToLower(h) == h
}

// addKey is POST /v1/admin/keys {"tenant", "sha256"}: the hash becomes a key of the tenant
// on every node. The key itself never reaches the gateway: `oncegate key add` makes it and
// sends its hash.
func (s *Server) addKey(c *fiber.Ctx) error {
	if err := s.authenticateKeyAdmin(c); err != nil {
		return err
	}
	var in struct {
		Tenant string `json:"tenant"`
		Hash   string `json:"sha256"`
	}
	if err := json.Unmarshal(c.Body(), &in); err != nil {
		return errKeyAdminBody
	}
	if !validKeyHash(in.Hash) {
		return errKeyAdminHash
	}
	if !s.isTenant(in.Tenant) {
		return errKeyAdminTenant
	}
	if _, ok := s.configTenantOf(in.Hash); ok {
		return ErrKeyOtherTenant // a configured key is never a second tenant's, nor re-added
	}
	key, err := s.keys.Add(c.UserContext(), strings.Clone(in.Tenant), strings.Clone(in.Hash))
	if err != nil {
		return err
	}
	key.Source = "runtime"
	return c.Status(http.StatusCreated).JSON(key)
}

// revokeKey is DELETE /v1/admin/keys/{sha256}: the key is refused on every node from when
// they see it, whether it was added at run time or configured.
func (s *Server) revokeKey(c *fiber.Ctx) error {
	if err := s.authenticateKeyAdmin(c); err != nil {
		return err
	}
	hash := strings.Clone(c.Params("hash"))
	if !validKeyHash(hash) {
		return errKeyAdminHash
	}
	tenant, configured := s.configTenantOf(hash)
	key, err := s.keys.Revoke(c.UserContext(), hash, tenant)
	if err != nil {
		return err
	}
	key.Source = "runtime"
	if configured {
		key.Source = "config"
	}
	return c.JSON(key)
}

// listKeys is GET /v1/admin/keys: every key, with its tenant and source, and when it was
// created and revoked (a configured key has no creation time).
func (s *Server) listKeys(c *fiber.Ctx) error {
	if err := s.authenticateKeyAdmin(c); err != nil {
		return err
	}
	stored, err := s.keys.List(c.UserContext())
	if err != nil {
		return err
	}
	out := make([]RuntimeKey, 0, len(stored))
	inStore := map[string]bool{}
	for _, k := range stored {
		inStore[k.Hash] = true
		k.Source = "runtime"
		if _, ok := s.configTenantOf(k.Hash); ok {
			k.Source = "config"
		}
		out = append(out, k)
	}
	for _, t := range s.tenants {
		for _, h := range t.hashes {
			if hx := hex.EncodeToString(h); !inStore[hx] {
				out = append(out, RuntimeKey{Hash: hx, Tenant: t.id, Source: "config"})
			}
		}
	}
	return c.JSON(fiber.Map{"object": "list", "data": out})
}

// isTenant reports whether id is a configured tenant.
func (s *Server) isTenant(id string) bool {
	return id != "" && slices.ContainsFunc(s.tenants, func(t tenantKeys) bool { return t.id == id })
}

// configTenantOf is the configured tenant whose key has the hash hashHex.
func (s *Server) configTenantOf(hashHex string) (string, bool) {
	sum, err := hex.DecodeString(hashHex)
	if err != nil {
		return "", false
	}
	for _, t := range s.tenants {
		for _, h := range t.hashes {
			if string(h) == string(sum) {
				return t.id, true
			}
		}
	}
	return "", false
}

// runtimeTenantOf answers for a key the store knows: its tenant (ok), or refused (known and
// revoked, or of a tenant no longer configured). known false: the store has no entry, and the
// configuration decides. A revocation wins over the configuration.
func (s *Server) runtimeTenantOf(sum [sha256.Size]byte) (tenant string, ok, known bool) {
	if s.keys == nil {
		return "", false, false
	}
	k, found := s.keys.Lookup(hex.EncodeToString(sum[:]))
	if !found {
		return "", false, false
	}
	if !k.Revoked.IsZero() || !s.isTenant(k.Tenant) {
		return "", false, true
	}
	return k.Tenant, true, true
}
