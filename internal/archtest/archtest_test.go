package archtest

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/oncegate/oncegate"

// floors places every package of the module. A package may import (directly or not) only
// packages on lower floors; on the shared floors (0, the internal leaves; 1, the dialects)
// the packages may import each other, but above them two rooms of one floor never import
// each other. A new package must be placed here.
var floors = map[string]int{
	// 0: leaves: provider adapters and wire formats, config, the embedded server, the JSON
	// scanner, resilience, the mock backend, the bench tool, the status board, the metrics, the
	// test kit, the configuration reference generator.
	"internal/anthropicwire": 0,
	// The Go client of the effects API (client/effects): a leaf for callers, free of NATS
	// and of the server (keepOut).
	"client/effects":            0,
	"internal/backend":          0,
	"internal/bench":            0,
	"internal/clock":            0,
	"internal/config":           0,
	"internal/docgen":           0,
	"internal/genai":            0,
	"internal/jsonscan":         0,
	"internal/jsonscan/jsonref": 0,
	"internal/jsdirect":         0,
	"internal/jsleader":         0,
	"internal/jspub":            0,
	"internal/jsretry":          0,
	"internal/mockllm":          0,
	"internal/natsrv":           0,
	"internal/openaiwire":       0,
	"internal/partition":        0,
	"internal/replicas":         0,
	"internal/resilience":       0,
	"internal/responseswire":    0,
	"internal/status":           0,
	"internal/telemetry":        0,
	"internal/testkit":          0,
	"internal/testkit/freeport": 0,
	"internal/testkit/lb":       0,
	"internal/tracing":          0,
	// 1: the API dialects (package dialect/), between the workers and the backends: the seam,
	// one package per API, and the table of them all. Like the leaves, they may import each
	// other (a dialect may build on another's frames, the table imports them all), and never a
	// room above them.
	"dialect":           1,
	"dialect/anthropic": 1,
	"dialect/azure":     1,
	"dialect/bedrock":   1,
	"dialect/dialects":  1,
	"dialect/gemini":    1,
	"dialect/openai":    1,
	"dialect/responses": 1,
	// 2: the stores (the effects ledger among them: httpapi's effects API is its only user),
	// and the dashboard's snapshots of every process (its bucket and their aggregation;
	// intent, workers and httpapi feed it or read it).
	"kv":        2,
	"effects":   2,
	"jobs":      2,
	"ledger":    2,
	"dashboard": 2,
	"cold":      2,
	// 3: the exactly-once core.
	"intent": 3,
	// 4: the two faces of the core.
	"httpapi": 4,
	"workers": 4,
	// 5: the composition root.
	"gateway": 5,
	// 6: the binary.
	"cmd/oncegate": 6,
}

// shared are the floors whose packages may import each other.
var shared = map[int]bool{0: true, 1: true}

// testOnly are packages outside the floors: tests, benchmarks, examples, and the part of the test kit
// that starts a whole gateway (it imports the composition root, and only tests import it).
var testOnly = map[string]bool{
	"bench/floor":                 true,
	"bench/leaders":               true,
	"bench/retention":             true,
	"deploy":                      true,
	"docs":                        true,
	"e2e":                         true,
	"examples/openai-go":          true,
	"internal/archtest":           true,
	"internal/testkit/gatewaykit": true,
	"internal/testkit/ledgerkit":  true,
}

// keepOut lists what a package must not depend on besides the floor rule: the core and the
// stores know nothing of HTTP or providers.
var keepOut = map[string][]string{
	"intent":    {"github.com/gofiber/fiber/v2", module + "/internal/backend"},
	"kv":        {"github.com/gofiber/fiber/v2", module + "/internal/config", module + "/internal/backend"},
	"jobs":      {"github.com/gofiber/fiber/v2", module + "/internal/config", module + "/internal/backend"},
	"ledger":    {"github.com/gofiber/fiber/v2", module + "/internal/config", module + "/internal/backend"},
	"effects":   {"github.com/gofiber/fiber/v2", module + "/internal/config", module + "/internal/backend"},
	"workers":   {"github.com/gofiber/fiber/v2"},
	"dashboard": {"github.com/gofiber/fiber/v2", module + "/internal/config", module + "/internal/backend"},
	"httpapi":   {module + "/internal/backend"},
	// A caller's program imports the client: nothing of the server's, nothing but the wire.
	"client/effects": {"github.com/gofiber/fiber/v2", "github.com/nats-io/nats.go", module + "/internal/config", module + "/internal/jsonscan"},
	// The dialects speak to backends for the workers: no HTTP server, no NATS (and, by their
	// floor, no room above them: workers, httpapi, intent, gateway, jobs, kv, ledger, dashboard).
	"dialect":           dialectKeepOut,
	"dialect/anthropic": dialectKeepOut,
	"dialect/azure":     dialectKeepOut,
	"dialect/bedrock":   dialectKeepOut,
	"dialect/dialects":  dialectKeepOut,
	"dialect/gemini":    dialectKeepOut,
	"dialect/openai":    dialectKeepOut,
	"dialect/responses": dialectKeepOut,
}

var dialectKeepOut = []string{"github.com/gofiber/fiber/v2", "github.com/nats-io/nats.go", "github.com/nats-io/nats.go/jetstream"}

// testKit may be imported by test files only (and by the kit itself).
var testKit = []string{"internal/testkit", "internal/testkit/freeport", "internal/testkit/gatewaykit", "internal/testkit/ledgerkit", "internal/testkit/lb"}

type pkg struct {
	path string   // relative to the module
	deps []string // every dependency, direct or not
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkgs = append(pkgs, pkg{path: rel(f[0]), deps: f[1:]})
	}
	return pkgs
}

func rel(importPath string) string {
	return strings.TrimPrefix(strings.TrimPrefix(importPath, module), "/")
}

func TestImportGraph(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < len(floors) {
		t.Fatalf("go list found %d packages, fewer than the %d placed on floors", len(pkgs), len(floors))
	}
	for _, p := range pkgs {
		t.Run(p.path, func(t *testing.T) {
			_, placed := floors[p.path]
			if !placed && !testOnly[p.path] {
				t.Fatalf("%s is on no floor: place it in archtest's floors map (or testOnly)", p.path)
			}
			for _, d := range p.deps {
				for _, k := range testKit {
					if !testOnly[p.path] && !slices.Contains(testKit, p.path) && d == module+"/"+k {
						t.Errorf("%s imports the test kit %s outside its tests", p.path, k)
					}
				}
				for _, bad := range keepOut[p.path] {
					if d == bad {
						t.Errorf("%s depends on %s, which it must keep out of", p.path, bad)
					}
				}
				if !placed || !strings.HasPrefix(d, module+"/") {
					continue
				}
				if msg := climbs(p.path, rel(d)); msg != "" {
					t.Error(msg)
				}
			}
		})
	}
}

// climbs says what is wrong with the arrow from → dep between two packages of the module
// ("" when nothing is).
func climbs(from, dep string) string {
	floor, df, ok := floors[from], 0, false
	if df, ok = floors[dep]; !ok {
		return fmt.Sprintf("%s depends on %s, which is not on a lower floor", from, dep)
	}
	switch {
	case df > floor:
		return fmt.Sprintf("%s (floor %d) depends on %s (floor %d): arrows point down, cmd → gateway → httpapi, workers → intent → jobs, kv, ledger → dialect → internal", from, floor, dep, df)
	case df == floor && !shared[floor]:
		return fmt.Sprintf("%s depends on %s, a room of its own floor: they never import each other", from, dep)
	}
	return ""
}

// TestRulesCanFail shows the check catches each kind of bad arrow, and lets good ones pass.
func TestRulesCanFail(t *testing.T) {
	cases := []struct {
		from, dep string
		bad       bool
	}{
		{"kv", "intent", true},                         // climbing
		{"internal/config", "kv", true},                // a leaf importing a room
		{"httpapi", "workers", true},                   // same floor
		{"kv", "jobs", true},                           // same floor
		{"workers", "e2e", true},                       // not on a floor
		{"httpapi", "intent", false},                   // down
		{"internal/backend", "internal/config", false}, // leaves among themselves
		{"dialect/openai", "kv", true},                 // a dialect importing a store
		{"dialect/openai", "jobs", true},
		{"dialect/anthropic", "workers", true},
		{"dialect/responses", "httpapi", true},
		{"dialect", "intent", true},
		{"dialect/dialects", "gateway", true},
		{"internal/backend", "dialect", true},          // a leaf importing a dialect
		{"dialect/anthropic", "dialect/openai", false}, // a dialect building on another
		{"dialect/openai", "internal/openaiwire", false},
		{"workers", "dialect/dialects", false},
	}
	for _, tc := range cases {
		t.Run(tc.from+"→"+tc.dep, func(t *testing.T) {
			if msg := climbs(tc.from, tc.dep); (msg != "") != tc.bad {
				t.Errorf("climbs(%s, %s) = %q, want bad=%v", tc.from, tc.dep, msg, tc.bad)
			}
		})
	}
}

// directKeepOut lists the rooms a package must not import directly although it may depend on
// them through a room between (the deps rule above sees through that room): httpapi answers
// from intent's views of a record and follows an execution with intent's Delivery, so the
// record's states and the chunk kinds are read in one place.
var directKeepOut = map[string][]string{
	"httpapi": {module + "/kv", module + "/jobs"},
}

func TestDirectImports(t *testing.T) {
	for path, bad := range directKeepOut {
		t.Run(path, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, module+"/"+path).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			if msg := importsAny(path, strings.Fields(string(out)), bad); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// importsAny says which of bad imports (a package's direct imports) holds ("" when none).
func importsAny(path string, imports, bad []string) string {
	var found []string
	for _, b := range bad {
		if slices.Contains(imports, b) {
			found = append(found, b)
		}
	}
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("%s imports %s directly: ask intent instead", path, strings.Join(found, ", "))
}

// TestDirectRuleCanFail shows the direct-import check catches an import and lets others pass.
func TestDirectRuleCanFail(t *testing.T) {
	bad := directKeepOut["httpapi"]
	if importsAny("httpapi", []string{module + "/intent", module + "/kv"}, bad) == "" {
		t.Error("an httpapi importing kv passed")
	}
	if importsAny("httpapi", []string{module + "/intent", module + "/jobs"}, bad) == "" {
		t.Error("an httpapi importing jobs passed")
	}
	if msg := importsAny("httpapi", []string{module + "/intent", module + "/ledger"}, bad); msg != "" {
		t.Errorf("an httpapi importing intent and ledger failed: %s", msg)
	}
}
