package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/oncegate/oncegate"

// forbidden lists, per package, project packages it must not depend on (directly or not).
var forbidden = map[string][]string{
	"httpapi":             {"workers", "internal/backend", "internal/gateway", "cmd/oncegate"},
	"workers":             {"httpapi", "internal/gateway", "cmd/oncegate"},
	"jobs":                {"kv", "httpapi", "workers", "internal/config", "internal/backend"},
	"kv":                  {"jobs", "httpapi", "workers", "internal/config", "internal/backend"},
	"internal/lease":      {"httpapi", "workers"},
	"internal/openaiwire": {"jobs", "kv", "httpapi", "workers"},
	"internal/config":     {"jobs", "kv", "httpapi", "workers"},
	"internal/mockllm":    {"jobs", "kv", "httpapi", "workers", "internal/config"},
	"ledger":              {"jobs", "kv", "httpapi", "workers", "internal/config", "internal/gateway", "cmd/oncegate"},
	"internal/testkit":    {"jobs", "kv", "ledger", "httpapi", "workers", "internal/config", "internal/gateway", "cmd/oncegate"},
}

func TestImportGraph(t *testing.T) {
	for pkg, bad := range forbidden {
		t.Run(pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
			}
			deps := map[string]bool{}
			for _, d := range strings.Fields(string(out)) {
				deps[d] = true
			}
			for _, b := range bad {
				if deps[module+"/"+b] {
					t.Errorf("%s depends on %s; dependencies must point cmd → httpapi/workers → jobs/kv", pkg, b)
				}
			}
		})
	}
}
