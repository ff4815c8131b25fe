package intent

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/oncegate/oncegate/internal/partition"
)

// The record key of an intent is a hash, never client text: hex of SHA-256 (128 bits), safe as
// a NATS subject token, a KV key and a message id, and scoped by tenant, so no key of one
// tenant, however crafted, can reach another tenant's record.

// AutoKeyPrefix marks a generated key (echoed to the client in Idempotency-Key, and usable in
// the status API): "auto-" and the record key.
const AutoKeyPrefix = "auto-"

// HashParts is the record key for parts (each part ends with a NUL, so ("ab","c") and
// ("a","bc") differ).
func HashParts(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// RecordKey maps a client's Idempotency-Key to its record key in a store of parts partitions
// (tagged with its partition, partition.Key).
func RecordKey(parts int, tenant, key string) string {
	return partition.Key(parts, HashParts(tenant, "key", key))
}

// AutoKey is the record key of a request sent without an Idempotency-Key: its content
// (fingerprint) on its endpoint, so an SDK's automatic retry of it is the same intent.
func AutoKey(parts int, tenant, method, path, fingerprint string) string {
	return partition.Key(parts, HashParts(tenant, "auto", method, path, fingerprint))
}

// LookupKey is the record key for the status API, where a generated key ("auto-<hash>", as
// echoed in Idempotency-Key) names its record directly; the caller checks the record's tenant.
// With partitions, a generated key carries its partition's tag (auto-p1-<hash>).
func LookupKey(parts int, tenant, key string) string {
	if rest, ok := strings.CutPrefix(key, AutoKeyPrefix); ok && isHex32(partition.Untagged(rest)) && int(partition.OfKey(rest)) < parts {
		return rest
	}
	return RecordKey(parts, tenant, key)
}

func isHex32(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
