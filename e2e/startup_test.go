package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/status"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestReadyzFollowsWorkers: with split roles, an API node's /readyz is false (503 with the
// reason) while no worker consumes JOBS, true once a worker runs, and false again after the
// worker stops. The api gateway owns the embedded NATS on a port; the worker is a second
// gateway (role worker) connected to it over the network.
func TestReadyzFollowsWorkers(t *testing.T) {
	apiCfg := gatewaykit.Config(t)
	apiCfg.Role = "api"
	apiCfg.NATS.Listen = "127.0.0.1:0"
	api := gatewaykit.StartGateway(t, apiCfg)

	readyz := func() (int, string) {
		resp := do(t, http.MethodGet, api.URL+"/readyz", "", nil)
		b := resp.Body
		return resp.Status, string(b)
	}
	notReady := func(when string) {
		t.Helper()
		var code int
		var body string
		// Polled for its reason too: until the readiness loop's first check, it says so.
		testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
			if code, body = readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"unavailable"`) || !strings.Contains(body, "no worker") {
				return fmt.Errorf("/readyz %s: %d %s, want 503 saying no worker is running", when, code, body)
			}
			return nil
		})
	}
	notReady("before any worker")

	stopWorker := startWorker(t, api.NATSURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if code, body := readyz(); code != http.StatusOK {
			return fmt.Errorf("/readyz with a worker running: %d %s, want 200", code, body)
		}
		return nil
	})
	// Ready means served: a request through the api node is executed by the worker.
	if r := postChat(t, api.URL, chatBody("oncegate-mock", "readyz", ""), nil); r.Status != http.StatusOK {
		t.Fatalf("request while ready: %d %s", r.Status, r.Body)
	}

	stopWorker()
	// A worker that stops cleanly leaves the board as it stops, not when its entry expires.
	board, err := status.Open(ctx, api.JetStream(t, "readyz-board"), 10*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ws, err := board.Read(ctx); err != nil || len(ws) != 0 {
		t.Errorf("status board after the worker stopped: %d entries (%v), want none", len(ws), err)
	}
	notReady("after the worker stopped")
}
