package intent

import "testing"

func TestHashPartsAndRecordKey(t *testing.T) {
	h := HashParts("tenant", "key", "k")
	if !isHex32(h) {
		t.Fatalf("HashParts = %q, want 32 lowercase hex characters", h)
	}
	if HashParts("ab", "c") == HashParts("a", "bc") || HashParts("a", "") == HashParts("a") {
		t.Errorf("HashParts does not separate its parts")
	}
	if RecordKey("a", "k1") != RecordKey("a", "k1") {
		t.Errorf("RecordKey is not deterministic")
	}
	for _, k := range []string{"k1", AutoKeyPrefix + AutoKey("a", "POST", "/v1/chat/completions", "fp")} {
		t.Run(k, func(t *testing.T) {
			ra, rb := RecordKey("a", k), RecordKey("b", k)
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
	auto := AutoKey("a", "POST", "/v1/chat/completions", "fp")
	cases := []struct {
		name, key, want string
	}{
		{"generated key names its record", AutoKeyPrefix + auto, auto},
		{"client key is hashed with the tenant", "k1", RecordKey("a", "k1")},
		{"auto- prefix with a non-hash tail is a client key", "auto-xyz", RecordKey("a", "auto-xyz")},
		{"upper-case hex is a client key", AutoKeyPrefix + "ABCDEF0123456789ABCDEF0123456789", RecordKey("a", AutoKeyPrefix+"ABCDEF0123456789ABCDEF0123456789")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := LookupKey("a", tc.key); got != tc.want {
				t.Errorf("LookupKey(a, %q) = %s, want %s", tc.key, got, tc.want)
			}
		})
	}
}
