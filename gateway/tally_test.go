package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/ledger"
)

// adminBill reads GET /v1/admin/bill of the anonymous tenant (this month).
func adminBill(t *testing.T, gw *gatewaykit.Gateway) ledger.Bill {
	t.Helper()
	var b ledger.Bill
	adminGet(t, gw, "/v1/admin/bill?tenant=anonymous", &b)
	return b
}

// TestAdminBillExecutionsAvoided drives one intent replayed twice and one joined once through
// a whole gateway, and reads the admin bill once the tally flushed (ledger.tally_every 50ms):
// exactly 3 executions avoided (1 joined, 2 replayed), the money they saved, and the calls.
func TestAdminBillExecutionsAvoided(t *testing.T) {
	cfg := gatewaykit.Config(t)
	sum := sha256.Sum256([]byte(adminKey))
	cfg.Admin.APIKeysSHA256 = []string{hex.EncodeToString(sum[:])}
	cfg.Ledger.Prices = map[string]config.Price{"*": {InputPerMillion: inPerMillion, OutputPerMillion: outPerMillion}}
	cfg.Ledger.TallyEvery = config.Duration(50 * time.Millisecond)
	gw := gatewaykit.StartGateway(t, cfg)

	a := post(t, gw, chatBody(config.MockModel, "tally: created", ""), key("t-created"))
	if a.header.Get("Oncegate-Idempotency") != "created" {
		t.Fatalf("status %d outcome %q", a.status, a.header.Get("Oncegate-Idempotency"))
	}
	replayedCost := charged(t, gw, a.header.Get("Oncegate-Job-Id"))
	for range 2 {
		if r := post(t, gw, chatBody(config.MockModel, "tally: created", ""), key("t-created")); r.header.Get("Oncegate-Idempotency") != "replayed" {
			t.Fatalf("status %d outcome %q", r.status, r.header.Get("Oncegate-Idempotency"))
		}
	}

	first := joinSlow(t, gw, chatBody(slowModel, "tally: joined", `"mock":{"inter_token_ms":100}`), "t-joined")
	joinedCost := charged(t, gw, first.header.Get("Oncegate-Job-Id"))

	var b ledger.Bill
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if b = adminBill(t, gw); b.ExecutionsAvoided != 3 || b.CompletedCharges != 2 {
			return fmt.Errorf("executions avoided %d, completed charges %d; want 3 and 2", b.ExecutionsAvoided, b.CompletedCharges)
		}
		return nil
	})
	net := replayedCost + joinedCost
	want := ledger.Calls{CompletedCharges: 2, Joined: 1, Replayed: 2, ExecutionsAvoided: 3, SavedMicros: 2*replayedCost + joinedCost,
		SuccessfulCalls: 5, CostPerSuccessfulCallMicros: int64(math.Round(float64(net) / 5)), DuplicateRatio: 0.6}
	if b.Calls != want || b.NetMicros != net {
		t.Errorf("bill calls %+v (net %d)\nwant       %+v (net %d)", b.Calls, b.NetMicros, want, net)
	}
	for _, l := range b.ByModel {
		switch l.Model {
		case config.MockModel:
			if l.Replayed != 2 || l.Joined != 0 || l.SavedMicros != 2*replayedCost || l.SuccessfulCalls != 3 {
				t.Errorf("%s line %+v", l.Model, l.Calls)
			}
		case slowModel:
			if l.Joined != 1 || l.Replayed != 0 || l.SavedMicros != joinedCost || l.SuccessfulCalls != 2 {
				t.Errorf("%s line %+v", l.Model, l.Calls)
			}
		}
	}
	// Nothing more is counted while nothing happens: the flushes publish nothing new.
	time.Sleep(150 * time.Millisecond) // three flush intervals
	if b := adminBill(t, gw); b.ExecutionsAvoided != 3 {
		t.Errorf("executions avoided became %d without requests", b.ExecutionsAvoided)
	}
}

// TestStopFlushesTally: with a flush interval longer than the test, the executions avoided
// reach OG_TALLY when the gateway stops (before its NATS connections close).
func TestStopFlushesTally(t *testing.T) {
	ext := runExternalNATS(t)
	cfg := gatewaykit.Config(t)
	cfg.NATS.URL = ext.url()
	cfg.Ledger.TallyEvery = config.Duration(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := gateway.Start(ctx, cfg, zerolog.Nop(), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = gw.Stop(context.Background())
		}
	}()
	url := "http://" + gw.Addr()
	g := &gatewaykit.Gateway{Gateway: gw, Cfg: cfg, URL: url}
	for i := range 2 {
		if a := post(t, g, chatBody(config.MockModel, "tally: stop", ""), key("t-stop")); a.status != http.StatusOK || (i == 1 && a.header.Get("Oncegate-Idempotency") != "replayed") {
			t.Fatalf("request %d: status %d outcome %q", i, a.status, a.header.Get("Oncegate-Idempotency"))
		}
	}
	stopped = true
	if err := gw.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rs, err := ledger.New(ext.jetStream("tally-test"), nil, "").Tallies(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || len(rs[0].Models) != 1 || rs[0].Models[0].Replayed != 1 || rs[0].Models[0].Model != config.MockModel {
		t.Fatalf("tally after stop: %+v, want one report of one replay", rs)
	}
}
