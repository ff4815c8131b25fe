package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// hitRatioExpr is the hit ratio over the counters' whole life: joined and replayed copies
// among the requests an execution answered (the metric contract's ratio without rate(), so a
// short run can be checked exactly; rate() needs samples on both sides of each increase).
const hitRatioExpr = `sum(oncegate_requests_total{outcome=~"joined|replayed"}) / sum(oncegate_requests_total{outcome=~"created|joined|replayed|bypassed"})`

// TestPrometheusScrapesTheGateway runs Debian's prometheus server against a gateway on
// loopback (scraping it every second, with deploy/prometheus/alerts.yml loaded), drives N
// created requests and M copies of them (joins of a live execution, then replays), and
// checks through Prometheus's query API what an operator would read: executions avoided is
// M and the hit ratio is M/(N+M). Every recording and alerting rule evaluates on the real
// series without an error.
//
// Without the prometheus binary the test skips, unless ONCEGATE_REQUIRE_TOOLS=1 (as CI sets
// it), where a missing binary fails it.
func TestPrometheusScrapesTheGateway(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("ONCEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("prometheus is required (ONCEGATE_REQUIRE_TOOLS=1): %v", err)
		}
		t.Skip("prometheus not installed (apt-get install prometheus; set ONCEGATE_REQUIRE_TOOLS=1 to make this a failure)")
	}
	rules, err := filepath.Abs(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	gw := gatewaykit.StartGateway(t, nil)
	prom := startPrometheus(t, bin, gw.Addr(), rules)

	// The target is up before any request, so the first scrape does not race the drive.
	testkit.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
		return prom.expect(`up{job="oncegate"}`, 1)
	})

	// N created: one slow execution (first token after 2 s) and two fast ones. M copies: two
	// joins of the slow one while it runs, then one replay of each key.
	const joins = 2
	keys := []string{"prom-slow", "prom-fast-1", "prom-fast-2"}
	slow := mockBody("prometheus slow", `{"ttft_ms":2000}`, "")
	bodies := map[string]string{keys[0]: slow, keys[1]: mockBody("prometheus fast 1", "", ""), keys[2]: mockBody("prometheus fast 2", "", "")}
	hdr := func(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

	creator := async(func() result { return send(http.MethodPost, gw.URL+chatPath, slow, hdr(keys[0])) })
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if r := send(http.MethodGet, gw.URL+"/v1/idempotency/"+keys[0], "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("the slow execution's record does not exist yet: %d %v", r.Status, r.Err)
		}
		return nil
	})
	var joiners []<-chan result
	for range joins {
		joiners = append(joiners, async(func() result { return send(http.MethodPost, gw.URL+chatPath, slow, hdr(keys[0])) }))
	}
	for _, k := range keys[1:] {
		expect(t, postChat(t, gw.URL, bodies[k], hdr(k)), http.StatusOK, "created")
	}
	expect(t, testkit.RequireChanRead(t, creator, 30*time.Second), http.StatusOK, "created")
	for _, j := range joiners {
		expect(t, testkit.RequireChanRead(t, j, 30*time.Second), http.StatusOK, "joined")
	}
	for _, k := range keys {
		expect(t, postChat(t, gw.URL, bodies[k], hdr(k)), http.StatusOK, "replayed")
	}
	if t.Failed() {
		t.FailNow()
	}
	n, m := len(keys), joins+len(keys)

	testkit.CheckFor(t, 15*time.Second, 200*time.Millisecond, func() error {
		if err := prom.expect(`sum(oncegate_executions_avoided_total)`, float64(m)); err != nil {
			return err
		}
		if err := prom.expect(`sum by (how) (oncegate_executions_avoided_total{how="joined"})`, joins); err != nil {
			return err
		}
		return prom.expect(hitRatioExpr, float64(m)/float64(n+m))
	})

	// Every rule has been evaluated on these series (after Prometheus had them), without an
	// error.
	seen := time.Now()
	testkit.CheckFor(t, 15*time.Second, 200*time.Millisecond, func() error { return prom.rulesHealthy(seen) })
}

// promServer is a prometheus process of a test and its HTTP API.
type promServer struct {
	base string // http://127.0.0.1:port
	log  *testkit.SyncBuffer
}

// startPrometheus runs bin scraping target every second with rules loaded, its storage in a
// temporary directory, listening on a free loopback port. The process is the test's: it is
// killed and waited for when the test ends, and its log printed if the test failed.
func startPrometheus(t *testing.T, bin, target, rules string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: oncegate
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := testkit.FreeAddr(t)
	p := &promServer{base: "http://" + addr, log: &testkit.SyncBuffer{}}
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.log.String())
		}
	})
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		select {
		case <-done:
			return fmt.Errorf("prometheus exited: %s", p.log.String())
		default:
		}
		r := send(http.MethodGet, p.base+"/-/ready", "", nil)
		if r.Status != http.StatusOK {
			return fmt.Errorf("prometheus not ready: %d %v", r.Status, r.Err)
		}
		return nil
	})
	return p
}

// apiResponse is the envelope of Prometheus's HTTP API.
type apiResponse struct {
	Status string          `json:"status"`
	Error  string          `json:"error"`
	Data   json.RawMessage `json:"data"`
}

func (p *promServer) api(path string) (json.RawMessage, error) {
	r := send(http.MethodGet, p.base+path, "", nil)
	if r.Err != nil {
		return nil, r.Err
	}
	var a apiResponse
	if err := json.Unmarshal(r.Body, &a); err != nil {
		return nil, fmt.Errorf("GET %s: %d %s", path, r.Status, r.Body)
	}
	if a.Status != "success" {
		return nil, fmt.Errorf("GET %s: %s", path, a.Error)
	}
	return a.Data, nil
}

// expect checks that the instant query expr has one sample and that it is want (within float
// rounding).
func (p *promServer) expect(expr string, want float64) error {
	data, err := p.api("/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return err
	}
	var v struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Value [2]any `json:"value"` // [unix time, "value"]
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	if v.ResultType != "vector" || len(v.Result) != 1 {
		return fmt.Errorf("%s: %s, want one sample of %v", expr, data, want)
	}
	s, _ := v.Result[0].Value[1].(string)
	got, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("%s: value %q: %w", expr, s, err)
	}
	if math.Abs(got-want) > 1e-9 {
		return fmt.Errorf("%s = %v, want %v", expr, got, want)
	}
	return nil
}

// rulesHealthy checks that Prometheus loaded rules and that each was last evaluated after
// since, with health "ok".
func (p *promServer) rulesHealthy(since time.Time) error {
	data, err := p.api("/api/v1/rules")
	if err != nil {
		return err
	}
	var v struct {
		Groups []struct {
			Rules []struct {
				Name           string    `json:"name"`
				Health         string    `json:"health"`
				LastError      string    `json:"lastError"`
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	n := 0
	for _, g := range v.Groups {
		for _, r := range g.Rules {
			n++
			if r.LastEvaluation.Before(since) {
				return fmt.Errorf("rule %s: last evaluated at %s, before the series were there", r.Name, r.LastEvaluation)
			}
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no rules loaded: %s", data)
	}
	return nil
}
