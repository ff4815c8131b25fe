package intent

import (
	"fmt"
	"testing"

	"github.com/oncegate/oncegate/internal/partition"
)

func TestHashPartsAndRecordKey(t *testing.T) {
	h := HashParts("tenant", "key", "k")
	if !isHex32(h) {
		t.Fatalf("HashParts = %q, want 32 lowercase hex characters", h)
	}
	if HashParts("ab", "c") == HashParts("a", "bc") || HashParts("a", "") == HashParts("a") {
		t.Errorf("HashParts does not separate its parts")
	}
	if RecordKey(1, "a", "k1") != RecordKey(1, "a", "k1") {
		t.Errorf("RecordKey is not deterministic")
	}
	for _, k := range []string{"k1", AutoKeyPrefix + AutoKey(1, "a", "POST", "/v1/chat/completions", "fp")} {
		t.Run(k, func(t *testing.T) {
			ra, rb := RecordKey(1, "a", k), RecordKey(1, "b", k)
			if !isHex32(ra) || !isHex32(rb) {
				t.Fatalf("record keys %q, %q: want 32 hex characters (safe as subject token and KV key)", ra, rb)
			}
			if ra == rb {
				t.Fatalf("tenants a and b map key %q to the same record %s", k, ra)
			}
		})
	}
}

func TestLookupKey(t *testing.T) {
	auto := AutoKey(1, "a", "POST", "/v1/chat/completions", "fp")
	cases := []struct {
		name, key, want string
	}{
		{"generated key names its record", AutoKeyPrefix + auto, auto},
		{"client key is hashed with the tenant", "k1", RecordKey(1, "a", "k1")},
		{"auto- prefix with a non-hash tail is a client key", "auto-xyz", RecordKey(1, "a", "auto-xyz")},
		{"upper-case hex is a client key", AutoKeyPrefix + "ABCDEF0123456789ABCDEF0123456789", RecordKey(1, "a", AutoKeyPrefix+"ABCDEF0123456789ABCDEF0123456789")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := LookupKey(1, "a", tc.key); got != tc.want {
				t.Errorf("LookupKey(1, a, %q) = %s, want %s", tc.key, got, tc.want)
			}
		})
	}
}

// With partitions, a record key carries its partition's tag, a generated key echoed as
// "auto-p<k>-…" finds its record again, and a tag of a partition the store does not have is a
// client key like any other text.
func TestKeysInPartitions(t *testing.T) {
	const parts = 4
	seen := map[partition.P]bool{}
	for i := range 64 {
		key := RecordKey(parts, "a", fmt.Sprint("k", i))
		p := partition.OfKey(key)
		seen[p] = true
		if int(p) >= parts || !isHex32(partition.Untagged(key)) {
			t.Fatalf("RecordKey(%d) = %q", parts, key)
		}
		if RecordKey(1, "a", fmt.Sprint("k", i)) != partition.Untagged(key) {
			t.Fatalf("the partitioned key %q is not the one-partition key tagged", key)
		}
		auto := AutoKey(parts, "a", "POST", "/v1/chat/completions", fmt.Sprint("fp", i))
		if got := LookupKey(parts, "a", AutoKeyPrefix+auto); got != auto {
			t.Fatalf("LookupKey(auto-%s) = %q", auto, got)
		}
	}
	if len(seen) != parts {
		t.Errorf("64 keys landed in %d of %d partitions", len(seen), parts)
	}
	foreign := AutoKeyPrefix + "p9-" + HashParts("x")
	if got := LookupKey(parts, "a", foreign); got != RecordKey(parts, "a", foreign) {
		t.Errorf("LookupKey(%q) = %q: a partition the store lacks must be a client key", foreign, got)
	}
}
