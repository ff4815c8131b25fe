package main

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestSetMemoryLimit: the runtime's soft limit becomes 90 % of what the provider (in main, the
// container's cgroup) reports; the operator's GOMEMLIMIT and AUTOMEMLIMIT=off leave it alone;
// no limit leaves none; memoryLimit says which is in effect. (It changes the process's limit:
// no t.Parallel, and the limit before is put back.)
func TestSetMemoryLimit(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name       string
		env        map[string]string
		provider   memlimit.Provider
		wantLimit  int64
		wantSource string
	}{
		{"a container's limit", nil, memlimit.Limit(gib), gib * 9 / 10, "cgroup"},
		{"no limit", nil, func() (uint64, error) { return 0, memlimit.ErrNoLimit }, 0, "none"},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "512MiB"}, memlimit.Limit(gib), math.MaxInt64, "GOMEMLIMIT"},
		{"AUTOMEMLIMIT off", map[string]string{"AUTOMEMLIMIT": "off"}, memlimit.Limit(gib), 0, "off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := debug.SetMemoryLimit(math.MaxInt64)
			t.Cleanup(func() { debug.SetMemoryLimit(before) })
			env := map[string]string{"GOMEMLIMIT": "", "AUTOMEMLIMIT": ""}
			for k, v := range tt.env {
				env[k] = v
			}
			for k, v := range env {
				t.Setenv(k, v)
			}
			if v := env["AUTOMEMLIMIT"]; v == "" {
				t.Setenv("AUTOMEMLIMIT", "0.9") // set, so that a value in the test's environment cannot change the ratio
			}
			if err := setMemoryLimit(tt.provider); err != nil {
				t.Fatal(err)
			}
			limit, source := memoryLimit(func(k string) string { return env[k] })
			if limit != tt.wantLimit || source != tt.wantSource {
				t.Fatalf("limit %d from %q, want %d from %q", limit, source, tt.wantLimit, tt.wantSource)
			}
		})
	}
}
