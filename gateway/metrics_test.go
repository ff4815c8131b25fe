package gateway_test

// The metrics of issue 13, driven through a whole gateway over real HTTP: each case sends
// requests of one outcome and asserts the exact change of every series it should move (and
// that no other series of the checked families moved), scraped from /metrics.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

const (
	adminKey  = "metrics-test-admin-key"
	slowModel = "oncegate-mock-slow"
	// The prices make a charge easy to check: 1 micro per input token, 2 per output token.
	inPerMillion, outPerMillion = 1_000_000, 2_000_000
)

// metricsGateway is a gateway with prices, an admin key (to read the ledger), a separate
// metrics listener, a max_wait short enough to see in_use, a backend that always fails behind
// a breaker that opens after two failures, and a catch-all backend for invented model names.
func metricsGateway(t *testing.T) *gatewaykit.Gateway {
	t.Helper()
	cfg := gatewaykit.Config(t)
	cfg.Metrics.Listen = "127.0.0.1:0"
	sum := sha256.Sum256([]byte(adminKey))
	cfg.Admin.APIKeysSHA256 = []string{hex.EncodeToString(sum[:])}
	cfg.Ledger.Prices = map[string]config.Price{"*": {InputPerMillion: inPerMillion, OutputPerMillion: outPerMillion}}
	cfg.Idempotency.MaxWait = config.Duration(300 * time.Millisecond)
	cfg.Backends[0].RetryBase, cfg.Backends[0].RetryCap = config.Duration(time.Millisecond), config.Duration(5*time.Millisecond)
	cfg.Backends = append(cfg.Backends,
		config.Backend{Name: "flaky", Type: config.TypeMock, Models: []string{flakyModel}, MaxAttempts: 1, Timeout: config.Duration(time.Minute),
			Mock:    config.MockKnobs{Tokens: 4},
			Breaker: config.Breaker{FailureRate: 0.5, MinRequests: 2, Window: config.Duration(time.Minute), OpenFor: config.Duration(time.Hour), Probes: 1}},
		config.Backend{Name: "catchall", Type: config.TypeOpenAI, BaseURL: anyModelUpstream(t), Models: []string{config.CatchAll},
			Timeout: config.Duration(time.Minute)})
	return gatewaykit.StartGateway(t, cfg)
}

const flakyModel = "oncegate-flaky"

// anyModelUpstream is an OpenAI-compatible upstream that serves any model name: the mock,
// behind a rewrite of the request's model (the mock serves only its own).
func anyModelUpstream(t *testing.T) string {
	t.Helper()
	mock := mockllm.New(mockllm.Options{Tokens: 4})
	model := regexp.MustCompile(`"model":"[^"]*"`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		b = model.ReplaceAll(b, []byte(`"model":"`+config.MockModel+`"`))
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		mock.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// series are the samples of one scrape: `name{k="v",…}` (labels sorted) → value; a
// histogram gives its _count and _sum.
type series map[string]float64

func scrapeURL(t *testing.T, url string, hdr map[string]string) series {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := gatewaykit.Client().Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: status %d: %s", url, resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: parse: %v", url, err)
	}
	out := series{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			slices.Sort(ls)
			key := name + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[strings.Replace(key, "{", "_count{", 1)] = float64(m.Histogram.GetSampleCount())
				out[strings.Replace(key, "{", "_sum{", 1)] = m.Histogram.GetSampleSum()
			}
		}
	}
	return out
}

// checked are the families whose every change a case must name; the others (latency sums,
// Go runtime, JetStream API errors…) are asserted only where named.
var checked = []string{
	"oncegate_requests_total", "oncegate_executions_avoided_total", "oncegate_saved_micros_total",
	"oncegate_backend_attempts_total", "oncegate_backend_retries_total", "oncegate_breaker_transitions_total",
	"oncegate_spend_micros_total", "oncegate_replay_cache_hits_total", "oncegate_followers_per_execution_count",
}

func isChecked(key string) bool {
	return slices.ContainsFunc(checked, func(f string) bool { return strings.HasPrefix(key, f+"{") })
}

// diff says how after-before differs from want (a want entry is an exact delta, or for a
// gauge with the "=" prefix an exact value).
func diff(before, after series, want map[string]float64) error {
	var errs []string
	for k, w := range want {
		if v, ok := strings.CutPrefix(k, "="); ok {
			if after[v] != w {
				errs = append(errs, fmt.Sprintf("%s = %v, want %v", v, after[v], w))
			}
			continue
		}
		if d := after[k] - before[k]; d != w {
			errs = append(errs, fmt.Sprintf("%s moved %v, want %v", k, d, w))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, named := want[k]; !named && isChecked(k) && after[k] != before[k] {
			errs = append(errs, fmt.Sprintf("%s moved %v, not expected", k, after[k]-before[k]))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, gw *gatewaykit.Gateway, body string, hdr map[string]string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := gatewaykit.Client().Do(req)
	if err != nil {
		t.Errorf("post: %v", err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func chatBody(model, msg, extra string) string {
	m, _ := json.Marshal(msg)
	b := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(m) + `}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func key(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

// chargeOf is the cost the ledger charged the job jobID (0 when it has no charge yet).
func chargeOf(t *testing.T, gw *gatewaykit.Gateway, jobID string) int64 {
	t.Helper()
	var out struct {
		Data []struct {
			Kind       string `json:"kind"`
			JobID      string `json:"job_id"`
			CostMicros int64  `json:"cost_micros"`
		} `json:"data"`
	}
	adminGet(t, gw, "/v1/admin/ledger?tenant=anonymous", &out)
	var sum int64
	for _, e := range out.Data {
		if e.JobID == jobID && e.Kind == "charge" {
			sum += e.CostMicros
		}
	}
	return sum
}

// adminGet decodes the JSON answer of GET path of the admin API into out.
func adminGet(t *testing.T, gw *gatewaykit.Gateway, path string, out any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, gw.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := gatewaykit.Client().Do(req)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// charged waits for the ledger's charge of jobID and returns it.
func charged(t *testing.T, gw *gatewaykit.Gateway, jobID string) int64 {
	t.Helper()
	var c int64
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if c = chargeOf(t, gw, jobID); c == 0 {
			return fmt.Errorf("no charge of job %s yet", jobID)
		}
		return nil
	})
	return c
}

func req(route, api, outcome, code string) string {
	return fmt.Sprintf(`oncegate_requests_total{api=%q,code=%q,outcome=%q,route=%q}`, api, code, outcome, route)
}

func avoided(model, how string) string {
	return fmt.Sprintf(`oncegate_executions_avoided_total{how=%q,model=%q,tenant="anonymous"}`, how, model)
}

func money(family, model string) string {
	return fmt.Sprintf(`oncegate_%s_micros_total{model=%q,tenant="anonymous"}`, family, model)
}

func attempts(backend, result string) string {
	return fmt.Sprintf(`oncegate_backend_attempts_total{backend=%q,result=%q}`, backend, result)
}

const (
	followersCount = `oncegate_followers_per_execution_count{}`
	followersSum   = `oncegate_followers_per_execution_sum{}`
	cacheHits      = `oncegate_replay_cache_hits_total{}`
)

// joinSlow sends body with key k on the slow mock, and once its execution runs, a stream copy
// that joins it (a stream copy waits for the end; a non-stream one only max_wait). It checks
// the outcomes, created and joined, and returns the first answer.
func joinSlow(t *testing.T, gw *gatewaykit.Gateway, body, k string) answer {
	t.Helper()
	slow := gw.Mock(t, "slowmock")
	n := slow.Stats().Requests
	var wg sync.WaitGroup
	var first answer
	wg.Go(func() { first = post(t, gw, body, key(k)) })
	reached(t, slow, n)
	second := post(t, gw, body[:len(body)-1]+`,"stream":true}`, key(k))
	wg.Wait()
	if first.header.Get("Oncegate-Idempotency") != "created" || second.header.Get("Oncegate-Idempotency") != "joined" || second.status != http.StatusOK {
		t.Fatalf("outcomes %q, %q (status %d)", first.header.Get("Oncegate-Idempotency"), second.header.Get("Oncegate-Idempotency"), second.status)
	}
	return first
}

// reached waits until the mock got more than n requests: the execution is running.
func reached(t *testing.T, mock *mockllm.Server, n int64) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if mock.Stats().Requests == n {
			return fmt.Errorf("the execution has not reached the backend")
		}
		return nil
	})
}

// TestMetricsOutcomes drives each outcome once and checks the exact counter deltas.
func TestMetricsOutcomes(t *testing.T) {
	gw := metricsGateway(t)
	metricsURL := "http://" + gw.MetricsAddr() + "/metrics"
	mock := config.MockModel

	// One intent that later cases replay and conflict with.
	var firstJob string
	var firstCost int64

	cases := []struct {
		name string
		// drive sends the case's requests and returns the deltas to see.
		drive func(t *testing.T) map[string]float64
	}{
		{"created", func(t *testing.T) map[string]float64 {
			a := post(t, gw, chatBody(mock, "metrics: created", ""), key("m-created"))
			if a.status != http.StatusOK || a.header.Get("Oncegate-Idempotency") != "created" {
				t.Fatalf("status %d outcome %q", a.status, a.header.Get("Oncegate-Idempotency"))
			}
			firstJob = a.header.Get("Oncegate-Job-Id")
			firstCost = charged(t, gw, firstJob)
			return map[string]float64{
				req("chat", "openai", "created", "2xx"): 1, attempts("mock", "ok"): 1,
				`oncegate_request_duration_seconds_count{api="openai",outcome="created"}`: 1,
				`oncegate_added_latency_seconds_count{api="openai"}`:                      1,
				`oncegate_backend_executions_total{backend="mock",result="completed"}`:    1,
				money("spend", mock): float64(firstCost), followersCount: 1, followersSum: 1,
			}
		}},
		{"replayed", func(t *testing.T) map[string]float64 {
			for range 2 { // the first replay reads the record and caches it, the second hits the cache
				if a := post(t, gw, chatBody(mock, "metrics: created", ""), key("m-created")); a.header.Get("Oncegate-Idempotency") != "replayed" {
					t.Fatalf("status %d outcome %q", a.status, a.header.Get("Oncegate-Idempotency"))
				}
			}
			return map[string]float64{req("chat", "openai", "replayed", "2xx"): 2, avoided(mock, "replayed"): 2,
				money("saved", mock): 2 * float64(firstCost), cacheHits: 1}
		}},
		{"joined", func(t *testing.T) map[string]float64 {
			first := joinSlow(t, gw, chatBody(slowModel, "metrics: joined", `"mock":{"inter_token_ms":250}`), "m-joined") // 16 tokens: 4 s
			cost := charged(t, gw, first.header.Get("Oncegate-Job-Id"))
			return map[string]float64{req("chat", "openai", "created", "2xx"): 1, req("chat", "openai", "joined", "2xx"): 1,
				avoided(slowModel, "joined"): 1, money("saved", slowModel): float64(cost), money("spend", slowModel): float64(cost),
				attempts("slowmock", "ok"): 1, followersCount: 1, followersSum: 2,
				`oncegate_time_to_first_token_seconds_count{api="openai",outcome="joined"}`: 1}
		}},
		{"bypassed", func(t *testing.T) map[string]float64 {
			a := post(t, gw, chatBody(mock, "metrics: created", ""), map[string]string{"Idempotency-Key": "m-created", "X-Allow-Duplicate": "true"})
			if a.header.Get("Oncegate-Idempotency") != "bypassed" {
				t.Fatalf("status %d outcome %q", a.status, a.header.Get("Oncegate-Idempotency"))
			}
			cost := charged(t, gw, a.header.Get("Oncegate-Job-Id"))
			return map[string]float64{req("chat", "openai", "bypassed", "2xx"): 1, attempts("mock", "ok"): 1,
				money("spend", mock): float64(cost), followersCount: 1, followersSum: 1}
		}},
		{"conflict", func(t *testing.T) map[string]float64 {
			if a := post(t, gw, chatBody(mock, "metrics: another body", ""), key("m-created")); a.status != http.StatusUnprocessableEntity {
				t.Fatalf("status %d", a.status)
			}
			return map[string]float64{req("chat", "openai", "conflict", "4xx"): 1}
		}},
		{"in_use", func(t *testing.T) map[string]float64 {
			// The backend stalls: a non-stream copy waits its max_wait (300 ms) and gets 409.
			body := chatBody(slowModel, "metrics: in use", `"mock":{"fault":"stall"}`)
			slow := gw.Mock(t, "slowmock")
			n := slow.Stats().Requests
			go post(t, gw, body, key("m-in-use")) // answered when the gateway stops
			reached(t, slow, n)
			if a := post(t, gw, body, key("m-in-use")); a.status != http.StatusConflict {
				t.Fatalf("status %d: %s", a.status, a.body)
			}
			return map[string]float64{req("chat", "openai", "in_use", "4xx"): 1}
		}},
		{"rejected", func(t *testing.T) map[string]float64 {
			if a := post(t, gw, `{"model":"oncegate-mock","messages":[]}`, nil); a.status != http.StatusBadRequest {
				t.Fatalf("status %d", a.status)
			}
			if a := post(t, gw, `not json`, nil); a.status != http.StatusBadRequest {
				t.Fatalf("status %d", a.status)
			}
			return map[string]float64{req("chat", "openai", "rejected", "4xx"): 2}
		}},
		{"backend 5xx, retried", func(t *testing.T) map[string]float64 {
			a := post(t, gw, chatBody(mock, "metrics: 503 once", `"mock":{"fault":"error_503","fault_first_n":1}`), nil)
			if a.status != http.StatusOK || a.header.Get("Oncegate-Attempts") != "2" {
				t.Fatalf("status %d attempts %q: %s", a.status, a.header.Get("Oncegate-Attempts"), a.body)
			}
			cost := charged(t, gw, a.header.Get("Oncegate-Job-Id"))
			return map[string]float64{req("chat", "openai", "created", "2xx"): 1, attempts("mock", "5xx"): 1, attempts("mock", "ok"): 1,
				`oncegate_backend_retries_total{backend="mock"}`: 1, money("spend", mock): float64(cost), followersCount: 1, followersSum: 1}
		}},
		{"breaker opens", func(t *testing.T) map[string]float64 {
			for i := range 3 { // two failures open it (min_requests 2); the third finds it open
				a := post(t, gw, chatBody(flakyModel, fmt.Sprintf("metrics: breaker %d", i), `"mock":{"fault":"error_503"}`), nil)
				if a.status != http.StatusServiceUnavailable {
					t.Fatalf("request %d: status %d", i, a.status)
				}
			}
			return map[string]float64{req("chat", "openai", "created", "5xx"): 2, req("chat", "openai", "degraded", "5xx"): 1,
				attempts("flaky", "5xx"): 2, `oncegate_breaker_transitions_total{backend="flaky",to="open"}`: 1,
				`=oncegate_breaker_state{backend="flaky"}`: 2, followersCount: 3, followersSum: 3}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := scrapeURL(t, metricsURL, nil)
			want := tc.drive(t)
			var last error
			testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
				last = diff(before, scrapeURL(t, metricsURL, nil), want)
				return last
			})
		})
	}

	// The API listener serves the same registry (open: no tenants are configured), with the
	// gauges read at scrape time: connected, and the JOBS backlog. The stalled in_use job is
	// not in it: this node admitted it with a worker slot free, so it runs here as a held job
	// (jobs.HeldMsg), never queued; the backlog counts the queue alone.
	s := scrapeURL(t, gw.URL+"/metrics", nil)
	if s[req("chat", "openai", "conflict", "4xx")] != 1 {
		t.Errorf("the API listener's /metrics does not show the conflict")
	}
	if v, ok := s["oncegate_nats_connected{}"]; !ok || v != 1 {
		t.Errorf("oncegate_nats_connected = %v (present %v), want 1", v, ok)
	}
	if v, ok := s["oncegate_jobs_backlog{}"]; !ok || v != 0 {
		t.Errorf("oncegate_jobs_backlog = %v (present %v), want 0 (the stalled job is held, not queued)", v, ok)
	}
}

// TestMetricsLabelsBounded: 50 requests with 50 invented model names and keys create no new
// label value: the models collapse to "other", the keys appear nowhere.
func TestMetricsLabelsBounded(t *testing.T) {
	gw := metricsGateway(t)
	metricsURL := "http://" + gw.MetricsAddr() + "/metrics"
	for range 2 { // a creation and a replay resolve the "other" series once
		post(t, gw, chatBody("invented-warmup", "metrics: warm-up", ""), key("warmup-key"))
	}
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if scrapeURL(t, metricsURL, nil)[money("spend", "other")] == 0 {
			return fmt.Errorf("the warm-up is not charged yet")
		}
		return nil
	})
	before := scrapeURL(t, metricsURL, nil)
	for i := range 50 {
		model, k := fmt.Sprintf("invented-model-%d", i), fmt.Sprintf("invented-key-%d", i)
		if a := post(t, gw, chatBody(model, "metrics: invented", ""), key(k)); a.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, a.status, a.body)
		}
		post(t, gw, chatBody(model, "metrics: invented", ""), key(k)) // a replay: avoided, by model
	}
	var after series
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		after = scrapeURL(t, metricsURL, nil)
		if d := after[avoided("other", "replayed")] - before[avoided("other", "replayed")]; d != 50 {
			return fmt.Errorf("replays of other models counted %v, want 50", d)
		}
		return nil
	})
	for k := range after {
		if strings.Contains(k, "invented") {
			t.Errorf("an invented name is a label value: %s", k)
		}
		if _, ok := before[k]; !ok && strings.HasPrefix(k, "oncegate_") && !strings.HasPrefix(k, "oncegate_jobs_backlog") {
			t.Errorf("a new series appeared: %s", k)
		}
	}
}

// TestMetricsListenTaken: a taken metrics port is one start-up error naming metrics.listen.
func TestMetricsListenTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := gatewaykit.Config(t)
	cfg.Metrics.Listen = ln.Addr().String()
	_, err = start(t, cfg)
	var se *gateway.StartError
	if !errors.As(err, &se) || se.Field != "metrics.listen" || !strings.Contains(err.Error(), "metrics listen "+ln.Addr().String()) {
		t.Fatalf("start with a taken metrics port: %v", err)
	}
}

// TestMetricsNeedAdminKeyWithTenants: with tenants configured, /metrics on the API listener
// names tenants and their spend, so it takes the admin key (a tenant's key is refused); the
// metrics listener serves it without one. A budget refusal is counted for its tenant.
func TestMetricsNeedAdminKeyWithTenants(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Metrics.Listen = "127.0.0.1:0"
	admin, tenant := sha256.Sum256([]byte(adminKey)), sha256.Sum256([]byte("tenant-key"))
	cfg.Admin.APIKeysSHA256 = []string{hex.EncodeToString(admin[:])}
	cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{hex.EncodeToString(tenant[:])}, Budget: &config.Budget{Limit: 1, Period: "day"}}}
	cfg.Ledger.Prices = map[string]config.Price{"*": {InputPerMillion: inPerMillion, OutputPerMillion: outPerMillion}}
	gw := gatewaykit.StartGateway(t, cfg)
	for _, tc := range []struct {
		name, key string
		want      int
	}{{"no key", "", http.StatusUnauthorized}, {"tenant key", "tenant-key", http.StatusUnauthorized}, {"admin key", adminKey, http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, gw.URL+"/metrics", nil)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := gatewaykit.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	// The budget (1 micro a day) refuses any new intent: a budget refusal, and a rejected 429.
	if a := post(t, gw, chatBody(config.MockModel, "metrics: over budget", ""), map[string]string{"Authorization": "Bearer tenant-key"}); a.status != http.StatusTooManyRequests {
		t.Fatalf("over budget: status %d: %s", a.status, a.body)
	}
	s := scrapeURL(t, "http://"+gw.MetricsAddr()+"/metrics", nil)
	if got := s[`oncegate_budget_refusals_total{tenant="acme"}`]; got != 1 {
		t.Errorf("budget refusals of acme %v, want 1", got)
	}
	if got := s[req("chat", "openai", "rejected", "4xx")]; got != 1 {
		t.Errorf("rejected 4xx %v, want 1", got)
	}
}
