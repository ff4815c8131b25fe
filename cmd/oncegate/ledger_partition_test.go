package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/ledger"
)

// TestLedgerCommandsReadEveryPartition: against a store of two partitions (LEDGER and
// LEDGER_P1, found from the stream names), verify, export, bill, head and reconcile read both
// and say what they did in each; a forged entry in LEDGER_P1 is found and said to be there.
func TestLedgerCommandsReadEveryPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, js := listeningNATS(t, ctx)
	url := ns.ClientURL()
	for _, p := range partition.All(2) {
		if err := ledger.EnsurePartition(ctx, js, p, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	clock := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	s := ledger.NewSet(js, ledger.Prices{"m": {InputPerMillion: 1_000_000}}, "USD", 2,
		ledger.WithClock(func() time.Time { clock = clock.Add(time.Minute); return clock }))
	tagged := partition.P(1).Tagged
	for _, c := range []ledger.ChargeInput{
		{Tenant: "acme", KeyHash: "aaaa", JobID: "J1", Epoch: 1, Model: "m", InputTokens: 100_000, Completed: true},
		{Tenant: "acme", KeyHash: tagged("bbbb"), JobID: "J2", Epoch: 1, Model: "m", InputTokens: 200_000},                  // zombie
		{Tenant: "acme", KeyHash: tagged("bbbb"), JobID: "J2", Epoch: 2, Model: "m", InputTokens: 200_000, Completed: true}, // kept
		{Tenant: "globex", KeyHash: tagged("cccc"), JobID: "J3", Epoch: 1, Model: "m", InputTokens: 50_000, Completed: true},
	} {
		if _, err := s.Charge(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, code int, out, errOut string, wantCode int, wants ...string) {
		t.Helper()
		if code != wantCode {
			t.Fatalf("%s: exit %d, want %d\n%s%s", what, code, wantCode, out, errOut)
		}
		for _, w := range wants {
			if !strings.Contains(out+errOut, w) {
				t.Errorf("%s: no %q in\n%s%s", what, w, out, errOut)
			}
		}
	}

	code, out, errOut := runLedger(t, "verify", "--nats-url", url)
	expect("verify", code, out, errOut, 0, "ledger streams (2 partitions): chain intact: 4 entries, 2 tenants",
		"partition 0 (LEDGER): 1 entries, 1 tenants' chains checked", "partition 1 (LEDGER_P1): 3 entries, 2 tenants' chains checked")

	code, out, errOut = runLedger(t, "export", "--nats-url", url)
	expect("export", code, "", errOut, 0, "entries by partition: LEDGER 1, LEDGER_P1 3")
	file := filepath.Join(t.TempDir(), "export.jsonl")
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runLedger(t, "verify", file)
	expect("verify the export", code, out, errOut, 0, "chain intact: 4 entries, 2 tenants", "partition 1 (LEDGER_P1): 3 entries")

	code, out, errOut = runLedger(t, "bill", "--nats-url", url, "--tenant", "acme", "--json")
	expect("bill", code, out, errOut, 0)
	var b ledger.Bill
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if b.Charges != 3 || b.NetMicros != 500_000 {
		t.Errorf("acme's bill: %d charges, net %d; want 3, 500000 (both partitions)", b.Charges, b.NetMicros)
	}
	code, out, errOut = runLedger(t, "bill", "--nats-url", url)
	expect("text bill", code, out, errOut, 0, "read 2 partitions: LEDGER, LEDGER_P1", "0.550000")

	code, out, errOut = runLedger(t, "reconcile", "--nats-url", url, "--dry-run")
	expect("dry run", code, out, errOut, 0, "1 reversals would be appended", "partition 1 (LEDGER_P1): 3 entries read, 1 reversals would be appended",
		"partition 0 (LEDGER): 1 entries read, 0 reversals")
	code, out, errOut = runLedger(t, "reconcile", "--nats-url", url)
	expect("reconcile", code, out, errOut, 0, "1 reversals appended", "partition 1 (LEDGER_P1): 3 entries, 2 intents, 1 charged more than once, 1 reversals appended",
		"partition 0 (LEDGER): 1 entries, 1 intents, 0 charged more than once, 0 reversals appended")

	heads := filepath.Join(t.TempDir(), "heads.json")
	code, out, errOut = runLedger(t, "head", "--nats-url", url, "--out", heads)
	expect("head", code, out, errOut, 0, "heads of 2 tenants, 5 entries")
	code, out, errOut = runLedger(t, "verify", "--nats-url", url, "--heads", heads)
	expect("verify --heads", code, out, errOut, 0, "3 tenants anchored") // acme's two chains and globex's

	// A forged entry in LEDGER_P1: a copy of globex's charge with another epoch, its hash kept.
	m, err := js.Conn().Request("$JS.API.DIRECT.GET.LEDGER_P1.p1."+ledger.Subject("globex"), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(string(m.Data), `"epoch":1`, `"epoch":3`, 1)
	if forged == string(m.Data) {
		t.Fatalf("no epoch in %s", m.Data)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "p1." + ledger.Subject("globex"), Data: []byte(forged)}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runLedger(t, "verify", "--nats-url", url)
	expect("verify after a forgery", code, out, errOut, 1, "partition 1, seq 5", "1 findings")
}
