package deploy

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// requireTool returns the path of the named binary. Without it the test skips, unless
// ONCEGATE_REQUIRE_TOOLS=1 (as CI sets it), where a missing tool fails it.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("ONCEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s is required (ONCEGATE_REQUIRE_TOOLS=1): %v", name, err)
		}
		t.Skipf("%s not installed (apt-get install %s; set ONCEGATE_REQUIRE_TOOLS=1 to make this a failure)", name, pkg)
	}
	return path
}

// TestAlertRules runs promtool on the rules: `check rules` (syntax, PromQL, templates) and
// `test rules` (alerts_test.yml: every alert fires on its case and stays silent on the
// other, with the labels and annotations an on-call reads).
func TestAlertRules(t *testing.T) {
	promtool := requireTool(t, "promtool", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
