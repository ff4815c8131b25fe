package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const (
	dashboardPath = "grafana/oncegate.json"
	rulesPath     = "prometheus/alerts.yml"
)

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// readDashboard is the dashboard file, decoded.
func readDashboard(t *testing.T) dashboard {
	return decodeFile[dashboard](t, dashboardPath, json.Unmarshal)
}

// readRules is the rule file, decoded.
func readRules(t *testing.T) ruleFile { return decodeFile[ruleFile](t, rulesPath, yaml.Unmarshal) }

// decodeFile reads path and decodes it with unmarshal, or fails the test.
func decodeFile[T any](t *testing.T, path string, unmarshal func([]byte, any) error) T {
	t.Helper()
	var v T
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// query is one PromQL expression and where it is used.
type query struct{ where, expr string }

// dashboardQueries are the dashboard's panel queries and template-variable queries.
func dashboardQueries(d dashboard) []query {
	var qs []query
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("panel %d %q", p.ID, p.Title), tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		qs = append(qs, query{"variable " + v.Name, v.Definition})
	}
	return qs
}

// ruleQueries are the rule file's expressions, and the names it records.
func ruleQueries(f ruleFile) (qs []query, recorded []string) {
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{"rule " + r.Record + r.Alert, r.Expr})
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
		}
	}
	return qs, recorded
}

var (
	// A gateway metric is any identifier with the oncegate_ prefix: no label, function or
	// keyword of PromQL has it. Recording rules are named oncegate:…, which this leaves out.
	metricName   = regexp.MustCompile(`\boncegate_[a-zA-Z0-9_]+`)
	recordedName = regexp.MustCompile(`\boncegate:[a-zA-Z0-9_:]+`)
)

// TestDashboardShape: the dashboard imports into Grafana with a Prometheus chosen at import
// (a ${DS_PROMETHEUS} input that every panel uses), panel ids are unique, every panel but a
// row has a query, and it shows what issue 13 asks for.
func TestDashboardShape(t *testing.T) {
	d := readDashboard(t)
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs = %+v, want one Prometheus datasource input DS_PROMETHEUS", d.Inputs)
	}
	ids := map[int]bool{}
	var titles []string
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		titles = append(titles, strings.ToLower(p.Title))
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q does not use the ${DS_PROMETHEUS} datasource", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
		}
	}
	all := strings.Join(titles, "\n")
	for _, want := range []string{"hit ratio", "outcome", "executions avoided", "money saved", "spend", "breaker", "latency added", "jobs backlog", "followers"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel title mentions %q", want)
		}
	}
}

// grafanaVars are values for the dashboard's variables, for checking its queries outside
// Grafana.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$job", ".*")

// TestDashboardQueriesParse: every dashboard query is valid PromQL, checked by promtool (each
// one, variables filled in, as a recording rule of a temporary rule file).
func TestDashboardQueriesParse(t *testing.T) {
	promtool := requireTool(t, "promtool", "prometheus")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	qs := dashboardQueries(readDashboard(t))
	for i, q := range qs {
		expr := q.expr
		if strings.HasPrefix(expr, "label_values(") { // a Grafana function, not PromQL
			expr = strings.TrimSuffix(strings.TrimPrefix(expr, "label_values("), ", job)")
		}
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: grafanaVars.Replace(expr)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s\n%s", len(qs), err, out, b)
	}
}
