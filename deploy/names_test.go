package deploy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestMetricNamesExported: every metric the dashboard and the alert rules query is exported
// by a running gateway, and every recording rule the dashboard names is in alerts.yml. A
// gateway with metrics answers a created request and its replay, then its /metrics is read:
// a histogram counts through its _bucket, _sum and _count series. A vector that has no series
// yet (a tenant's first reversal creates its series) counts when the gateway's registry
// describes it, and the test logs which ones it took that way.
func TestMetricNamesExported(t *testing.T) {
	qs := dashboardQueries(readDashboard(t))
	rq, recorded := ruleQueries(readRules(t))
	qs = append(qs, rq...)
	if len(qs) < 20 {
		t.Fatalf("only %d queries found in the dashboard and the rules", len(qs))
	}

	// A priced model, so charges and savings have series; a stream, so time to first token has.
	cfg := gatewaykit.Config(t)
	cfg.Ledger.Prices = map[string]config.Price{config.MockModel: {InputPerMillion: 1_000_000, OutputPerMillion: 1_000_000}}
	gw := gatewaykit.StartGateway(t, cfg)
	client := gatewaykit.Client()
	for i, stream := range []string{"false", "true"} {
		body := `{"model":"` + config.MockModel + `","stream":` + stream + `,"messages":[{"role":"user","content":"metric names"}]}`
		for _, want := range []string{"created", "replayed"} {
			req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("deploy-metric-names-%d", i))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Oncegate-Idempotency") != want {
				t.Fatalf("stream %s: status %d, outcome %q; want 200 %s", stream, resp.StatusCode, resp.Header.Get("Oncegate-Idempotency"), want)
			}
		}
	}
	scraped := scrapeFamilies(t, client, gw.URL+"/metrics")
	described := describedNames(gw.Metrics().Registry())

	var lazy []string
	for _, q := range qs {
		for _, name := range metricName.FindAllString(q.expr, -1) {
			family, ok := exported(name, scraped)
			switch {
			case ok:
			case described[family] != "":
				if !slices.Contains(lazy, family) {
					lazy = append(lazy, family)
				}
			default:
				t.Errorf("%s uses %s, which the gateway does not export", q.where, name)
			}
		}
		for _, name := range recordedName.FindAllString(q.expr, -1) {
			if !slices.Contains(recorded, name) {
				t.Errorf("%s uses %s, which alerts.yml does not record", q.where, name)
			}
		}
	}
	if len(lazy) > 0 {
		slices.Sort(lazy)
		t.Logf("registered, no series yet in this short run: %s", strings.Join(lazy, ", "))
	}
}

// exported says whether name is a series of a family in families (name → type), and which
// family.
func exported(name string, families map[string]string) (string, bool) {
	if _, ok := families[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, cut := strings.CutSuffix(name, suffix); cut {
			if families[base] == "histogram" {
				return base, true
			}
			return base, false
		}
	}
	return name, false
}

// scrapeFamilies reads url's exposition text and returns its families: name → type, from the
// "# TYPE" lines.
func scrapeFamilies(t *testing.T, client *http.Client, url string) map[string]string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	families := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = f[3]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(families) == 0 {
		t.Fatalf("GET %s: no metric families", url)
	}
	return families
}

// describedNames are the metric names reg's collectors describe (name → its description),
// whether or not they have a series yet.
func describedNames(reg *prometheus.Registry) map[string]string {
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	// Desc has no accessor for its name; its String says fqName: "…" first.
	fq := regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	names := map[string]string{}
	for d := range ch {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = d.String()
		}
	}
	return names
}
