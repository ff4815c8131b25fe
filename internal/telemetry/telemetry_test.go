package telemetry_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/oncegate/oncegate/internal/telemetry"
)

// TestNilMetrics: every method of a nil *Metrics does nothing (rooms built without metrics).
func TestNilMetrics(t *testing.T) {
	var m *telemetry.Metrics
	m.Request(telemetry.RouteChat, telemetry.APIOpenAI, telemetry.Created, 200, time.Second, time.Millisecond)
	m.AddedLatency(telemetry.APIOpenAI, time.Millisecond)
	m.Attempt("b", telemetry.ResultOK, true)
	m.Execution("b", true)
	m.RetryBudgetRefused("b")
	m.Breaker("b", telemetry.BreakerOpen, true)
	m.Avoided("t", "m", true, 5)
	m.Spend("t", "m", 5)
	m.Reversal("t")
	m.DuplicateExecutions(1)
	m.BudgetRefused("t")
	m.Takeover()
	m.FencedWrite()
	m.LeaseRenewalFailed()
	m.Redelivered()
	m.Followers(3)
	m.ReplayCacheHit()
	m.JetStreamAPIError()
	m.SetBacklog(nil)
	m.SetConnected(nil)
	if m.Registry() != nil {
		t.Fatal("a nil Metrics has a registry")
	}
}

// TestLabelsBounded: names that are not configured collapse to one value (other, or
// anonymous for tenants), so clients cannot grow the series.
func TestLabelsBounded(t *testing.T) {
	m := telemetry.New(telemetry.Labels{Tenants: []string{"acme"}, Models: []string{"gpt-x"}, Backends: []string{"mock"}})
	for i := range 50 {
		name := "invented-" + strings.Repeat("x", i)
		m.Avoided("acme", name, false, 1)
		m.Spend(name, name, 1)
		m.Attempt(name, telemetry.ResultOK, false)
	}
	m.Avoided("acme", "gpt-x", true, 1)
	body := scrape(t, m)
	if strings.Contains(body, "invented") {
		t.Fatal("an invented name became a label value")
	}
	for _, want := range []string{
		`oncegate_executions_avoided_total{how="replayed",model="other",tenant="acme"} 50`,
		`oncegate_executions_avoided_total{how="joined",model="gpt-x",tenant="acme"} 1`,
		`oncegate_spend_micros_total{model="other",tenant="anonymous"} 50`,
		`oncegate_backend_attempts_total{backend="other",result="ok"} 50`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if n := testutil.CollectAndCount(m.Registry(), "oncegate_executions_avoided_total"); n != 2 {
		t.Errorf("executions_avoided series = %d, want 2", n)
	}
}

// TestRequestPathAllocatesNothing: once a label set is resolved, counting costs no allocation.
func TestRequestPathAllocatesNothing(t *testing.T) {
	m := telemetry.New(telemetry.Labels{Tenants: []string{"acme"}, Models: []string{"gpt-x"}, Backends: []string{"mock"}})
	call := func() {
		m.Request(telemetry.RouteChat, telemetry.APIOpenAI, telemetry.Joined, 200, time.Millisecond, time.Millisecond)
		m.Avoided("acme", "gpt-x", true, 7)
		m.Attempt("mock", telemetry.Result5xx, true)
	}
	call()
	if n := testing.AllocsPerRun(100, call); n != 0 {
		t.Fatalf("allocations per call = %v, want 0", n)
	}
}

func scrape(t *testing.T, m *telemetry.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}
