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
// NATS, not from A's own process.
func TestDashboardShowsTheWholeCluster(t *testing.T) {
	acfg := gatewaykit.Config(t)
	acfg.Role = "api"
	acfg.NATS.Listen = "127.0.0.1:0"
	a := gatewaykit.StartGateway(t, acfg)

	startWorker(t, a.NATSURL())

	resp, err := openStream(http.MethodGet, a.URL+"/dashboard/stream", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("dashboard stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	body := slowStream("cluster dashboard", 30)
	h := map[string]string{"Idempotency-Key": "dash-cluster"}
	creator := startStream(t, a.URL, body, h)
	copies := []live{startStream(t, a.URL, body, h), startStream(t, a.URL, body, h)}

	br := bufio.NewReader(resp.Body)
	deadline := time.Now().Add(15 * time.Second)
	var last dashboard.View
	for time.Now().Before(deadline) {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the dashboard stream: %v", err)
		}
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok {
			continue
		}
		if err := json.Unmarshal([]byte(data), &last); err != nil {
			t.Fatalf("a view that is not JSON: %v: %s", err, data)
		}
		roles := map[string]bool{}
		for _, n := range last.Nodes {
			roles[n.Roles] = true
		}
		for _, e := range last.Executions {
			if e.JobID == creator.job && e.Followers == 2 && e.Backend == "slowmock" && roles["api"] && roles["worker"] {
				waitStreams(t, append(copies, creator)...)
				return
			}
		}
	}
	t.Fatalf("node A's dashboard never showed job %s running on node B with 2 followers; last view: %+v", creator.job, last)
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
