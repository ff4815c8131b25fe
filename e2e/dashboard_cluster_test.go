package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestDashboardShowsTheWholeCluster: two gateways share one NATS, an API-only node A (which
// runs no execution) and a worker-only node B. A stream sent to A with 2 copies joined runs
// on B, and A's dashboard stream shows it, with B's worker and backend, the 2 followers
// counted on A, and both nodes in its list: the view comes from every node's snapshot in
// NATS, not from A's own process. Then a request whose backend keeps answering 503 fails on
// B, and A's dashboard lists the failure with its reason.
func TestDashboardShowsTheWholeCluster(t *testing.T) {
	acfg := gatewaykit.Config(t)
	acfg.Role = "api"
	acfg.NATS.Listen = "127.0.0.1:0"
	a := gatewaykit.StartGateway(t, acfg)

	startWorker(t, a.NATSURL())

	views := openViews(t, a.URL)

	body := slowStream("cluster dashboard", 30)
	h := map[string]string{"Idempotency-Key": "dash-cluster"}
	creator := startStream(t, a.URL, body, h)
	copies := []live{startStream(t, a.URL, body, h), startStream(t, a.URL, body, h)}

	views.until(t, "job "+creator.job+" running on node B with 2 followers", func(v dashboard.View) bool {
		roles := map[string]bool{}
		for _, n := range v.Nodes {
			roles[n.Roles] = true
		}
		for _, e := range v.Executions {
			if e.JobID == creator.job && e.Followers == 2 && e.Backend == "slowmock" && roles["api"] && roles["worker"] {
				return true
			}
		}
		return false
	})
	waitStreams(t, append(copies, creator)...)

	failed := postChat(t, a.URL, mockBody("cluster failure", `{"fault":"error_503"}`, ""), nil)
	job := failed.Header.Get("Oncegate-Job-Id")
	if failed.Status != http.StatusServiceUnavailable || job == "" {
		t.Fatalf("the failing request: %d (job %q) %s", failed.Status, job, failed.Body)
	}
	views.until(t, "the failure of job "+job+" on node B", func(v dashboard.View) bool {
		for _, e := range v.Events {
			if e.JobID == job && e.Kind == dashboard.EventFailed && strings.HasPrefix(e.Reason, "503") {
				return true
			}
		}
		return false
	})
}

// views reads a dashboard stream's events: the history it opens with, then views.
type views struct {
	br   *bufio.Reader
	last dashboard.View
	hist *dashboard.History
}

// openViews opens the dashboard stream of the gateway at base (closed when the test ends) and
// reads its history.
func openViews(t *testing.T, base string) *views {
	t.Helper()
	resp, err := openStream(http.MethodGet, base+"/dashboard/stream", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("dashboard stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	vs := &views{br: bufio.NewReader(resp.Body)}
	vs.history(t)
	return vs
}

// next reads the next event, with its name and data.
func (vs *views) next(t *testing.T) (event, data string) {
	t.Helper()
	for {
		line, err := vs.br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the dashboard stream: %v", err)
		}
		line = strings.TrimSpace(line)
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			return event, d
		}
	}
}

// history reads the stream's first event, which must be the history.
func (vs *views) history(t *testing.T) dashboard.History {
	t.Helper()
	event, data := vs.next(t)
	if event != "history" {
		t.Fatalf("the dashboard stream began with event %q, want history", event)
	}
	var h dashboard.History
	if err := json.Unmarshal([]byte(data), &h); err != nil {
		t.Fatalf("a history that is not JSON: %v: %s", err, data)
	}
	vs.hist = &h
	return h
}

// until reads views until ok says one is what the test waits for (what), failing after 15 s.
func (vs *views) until(t *testing.T, what string, ok func(dashboard.View) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		event, data := vs.next(t)
		if event != "view" {
			continue
		}
		if err := json.Unmarshal([]byte(data), &vs.last); err != nil {
			t.Fatalf("a view that is not JSON: %v: %s", err, data)
		}
		if ok(vs.last) {
			return
		}
	}
	t.Fatalf("the dashboard never showed %s; last view: %+v", what, vs.last)
}

// startWorker runs a worker-only gateway (a process of its own in production) connected to
// the NATS at natsURL; stop stops it (once: it also runs when the test ends).
func startWorker(t *testing.T, natsURL string) (stop func()) {
	t.Helper()
	cfg := gatewaykit.Config(t)
	cfg.Role = "worker"
	cfg.NATS.URL = natsURL
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := gateway.Start(ctx, cfg, zerolog.New(io.Discard), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := w.Stop(sctx); err != nil {
				t.Errorf("worker stop: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
