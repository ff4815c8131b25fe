package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

func runLedger(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, append([]string{"ledger"}, args...), &out, &errOut, func(string) string { return "" })
	return code, out.String(), errOut.String()
}

func TestLedgerVerifyFiles(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "ledger")
	tests := []struct {
		file string
		code int
		want string // in stdout for 0, stderr otherwise
	}{
		{"export-clean.jsonl", 0, "chain intact: 9 entries, 2 tenants"},
		{"export-clean.csv", 0, "chain intact: 9 entries, 2 tenants"},
		{"export-altered.jsonl", 1, "entry 1"},
		{"export-altered.csv", 1, "hash mismatch"},
		{"export-removed.jsonl", 1, "entry 3"},
		{"export-removed.csv", 1, "prev_hash"},
		{"export-swapped.jsonl", 1, "entry 2"},
		{"export-swapped-tenants.csv", 1, "sequence"},
		{"no-such-file.jsonl", 1, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			code, out, errOut := runLedger(t, "verify", filepath.Join(dir, tt.file))
			got := out
			if tt.code != 0 {
				got = errOut
			}
			if code != tt.code || !strings.Contains(got, tt.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d mentioning %q", code, out, errOut, tt.code, tt.want)
			}
		})
	}
	// The format flag may follow the file, and wins over the file name.
	code, _, errOut := runLedger(t, "verify", filepath.Join(dir, "export-clean.csv"), "--format", "jsonl")
	if code != 1 || !strings.Contains(errOut, "corrupt") {
		t.Fatalf("a CSV read as JSONL: exit %d, stderr %q; want exit 1 and a corrupt-entry error", code, errOut)
	}
}

func TestLedgerUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no connection", []string{"bill"}, "--nats-url"},
		{"both connections", []string{"bill", "--nats-url", "nats://127.0.0.1:1", "--data-dir", t.TempDir()}, "not both"},
		{"bad time", []string{"bill", "--from", "yesterday"}, "RFC 3339"},
		{"unknown command", []string{"audit", "--nats-url", "nats://127.0.0.1:1"}, "unknown command"},
		{"stray argument", []string{"bill", "extra"}, "unexpected argument"},
		{"no subcommand", nil, "usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runLedger(t, tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 mentioning %q", code, errOut, tt.want)
			}
		})
	}
	if code, _, errOut := runLedger(t, "bill", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(errOut, "no gateway data") {
		t.Fatalf("empty data dir: exit %d, stderr %q", code, errOut)
	}
}

// seedLedger writes two tenants' charges, one intent of acme charged twice (two epochs).
func seedLedger(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ledger.EnsureStream(ctx, js); err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	l := ledger.New(js, ledger.Prices{"gpt-4o-mini": {InputPerMillion: 150_000, OutputPerMillion: 600_000}}, "USD",
		ledger.WithClock(func() time.Time { clock = clock.Add(time.Minute); return clock }))
	for _, c := range []ledger.ChargeInput{
		{Tenant: "acme", KeyHash: "aaaa", JobID: "J1", Epoch: 1, Model: "gpt-4o-mini", InputTokens: 1_000_000, OutputTokens: 100_000, Completed: true}, // 210000
		{Tenant: "acme", KeyHash: "bbbb", JobID: "J2", Epoch: 1, Model: "gpt-4o-mini", InputTokens: 2_000_000},                                         // 300000, zombie
		{Tenant: "acme", KeyHash: "bbbb", JobID: "J2", Epoch: 2, Model: "gpt-4o-mini", InputTokens: 2_000_000, Completed: true},                        // 300000
		{Tenant: "globex", KeyHash: "cccc", JobID: "J3", Epoch: 1, Model: "gpt-4o-mini", InputTokens: 1_000_000, Completed: true},                      // 150000
	} {
		if _, err := l.Charge(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLedgerAgainstNATS: bill, reconcile and export through --nats-url (a listening embedded
// server, as a gateway with --nats-listen would be).
func TestLedgerAgainstNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, js := listeningNATS(t, ctx)
	seedLedger(t, js)
	url := ns.ClientURL()

	bill := func(period ...string) ledger.Bill {
		t.Helper()
		code, out, errOut := runLedger(t, append([]string{"bill", "--nats-url", url, "--tenant", "acme", "--json"}, period...)...)
		if code != 0 {
			t.Fatalf("bill: exit %d, stderr %s", code, errOut)
		}
		var b ledger.Bill
		if err := json.Unmarshal([]byte(out), &b); err != nil {
			t.Fatalf("bill output is not JSON: %v\n%s", err, out)
		}
		return b
	}
	march := []string{"--from", "2026-03-01T00:00:00Z", "--to", "2026-04-01T00:00:00Z"}
	if b := bill(march...); b.GrossMicros != 810_000 || b.NetMicros != 810_000 || b.Charges != 3 {
		t.Fatalf("bill before reconcile %+v: want 3 charges, 810000 gross and net", b)
	}

	usage := filepath.Join(t.TempDir(), "usage.csv")
	if err := os.WriteFile(usage, []byte("request_id,model,input_tokens,output_tokens,cost_micros\n"+
		"oncegate-aaaa,gpt-4o-mini,1000000,100000,210000\n"+
		"oncegate-bbbb,gpt-4o-mini,2000000,0,300000\n"+
		"oncegate-bbbb,gpt-4o-mini,2000000,0,300000\n"+
		"req_x,gpt-4o-mini,5,5,4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runLedger(t, "reconcile", "--nats-url", url, "--dry-run")
	if code != 0 || !strings.Contains(out, "1 reversals would be appended") {
		t.Fatalf("reconcile --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	// A provider line that matches no intent (req_x) is reported, and the exit status is 3 so
	// a cron job alerts; the reconciliation itself still happened.
	code, out, errOut = runLedger(t, "reconcile", "--nats-url", url, "--provider-usage", usage)
	t.Log(out)
	if code != exitUnexplained || !strings.Contains(out, "1 reversals appended (0.300000 USD)") ||
		!strings.Contains(out, "UNEXPLAINED (no intent): 1 lines, 0.000004") ||
		!strings.Contains(out, "reversed (absorbed by the platform): 1 lines, 0.300000") ||
		!strings.Contains(errOut, "1 lines, 0.000004 (exit 3)") {
		t.Fatalf("reconcile: exit %d (want %d)\n%s%s", code, exitUnexplained, out, errOut)
	}
	if code, out, errOut := runLedger(t, "reconcile", "--nats-url", url, "--provider-usage", usage, "--json"); code != exitUnexplained ||
		!strings.Contains(out, `"request_id": "req_x"`) {
		t.Fatalf("reconcile --json: exit %d (want %d)\n%s%s", code, exitUnexplained, out, errOut)
	}
	explained := filepath.Join(t.TempDir(), "usage.csv")
	if err := os.WriteFile(explained, []byte("request_id,model,input_tokens,output_tokens,cost_micros\n"+
		"oncegate-aaaa,gpt-4o-mini,1000000,100000,210000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runLedger(t, "reconcile", "--nats-url", url, "--provider-usage", explained); code != 0 {
		t.Fatalf("reconcile, every line explained: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runLedger(t, "reconcile", "--nats-url", url); code != 0 || !strings.Contains(out, "0 reversals appended") {
		t.Fatalf("second reconcile: exit %d\n%s", code, out)
	}
	// The reversal is dated when it was appended (now), like a credit note: March's bill, a
	// closed period, does not change; the all-time bill nets the duplicate out.
	if b := bill(march...); b.NetMicros != 810_000 || b.Reversals != 0 {
		t.Fatalf("March bill after reconcile %+v: want it unchanged", b)
	}
	if b := bill(); b.GrossMicros != 810_000 || b.ReversedMicros != 300_000 || b.NetMicros != 510_000 {
		t.Fatalf("bill after reconcile %+v: want gross 810000, reversed 300000, net 510000", b)
	}
	// Without a range, the JSON says null for the open bounds (never year 1) and gives the
	// range of the entries counted: the March charges, then the reversal appended today.
	code, out, errOut = runLedger(t, "bill", "--nats-url", url, "--tenant", "acme", "--json")
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); code != 0 || err != nil {
		t.Fatalf("bill --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if strings.Contains(out, "0001-01-01") || raw["from"] != nil || raw["to"] != nil {
		t.Errorf("open bounds: from %v, to %v; want null\n%s", raw["from"], raw["to"], out)
	}
	first, _ := raw["first_entry"].(string)
	last, _ := raw["last_entry"].(string)
	if !strings.HasPrefix(first, "2026-03-") || last <= first {
		t.Errorf("entry range %q .. %q: want the first March charge to the reversal", first, last)
	}
	if b := bill(march...); b.From.Format(time.RFC3339) != "2026-03-01T00:00:00Z" || b.To.Format(time.RFC3339) != "2026-04-01T00:00:00Z" {
		t.Errorf("a closed range: from %v to %v", b.From, b.To)
	}
	code, out, _ = runLedger(t, "bill", "--nats-url", url, "--tenant", "acme")
	t.Log(out)
	if code != 0 || !strings.Contains(out, "gpt-4o-mini") || !strings.Contains(out, "0.510000") {
		t.Fatalf("text bill: exit %d\n%s", code, out)
	}

	// An export of the live ledger verifies, in both formats; globex's alone too.
	for _, args := range [][]string{{"--format", "csv"}, {"--format", "jsonl"}, {"--tenant", "globex"}} {
		code, out, errOut := runLedger(t, append([]string{"export", "--nats-url", url}, args...)...)
		if code != 0 {
			t.Fatalf("export %v: exit %d, %s", args, code, errOut)
		}
		file := filepath.Join(t.TempDir(), "export."+formatOf("", args[1]))
		if args[0] == "--tenant" {
			file = filepath.Join(t.TempDir(), "export.jsonl")
		}
		if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		if code, out, errOut := runLedger(t, "verify", file); code != 0 {
			t.Fatalf("verify export %v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	if code, out, errOut := runLedger(t, "verify", "--nats-url", url); code != 0 || !strings.Contains(out, "5 entries, 2 tenants") {
		t.Fatalf("verify the live stream: exit %d\n%s%s", code, out, errOut)
	}
}

// TestLedgerDataDir: with the gateway stopped, --data-dir opens its store directly.
func TestLedgerDataDir(t *testing.T) {
	dataDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, err := natsrv.Start(ctx, natsrv.Options{StoreDir: filepath.Join(dataDir, "jetstream")})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ns.Connect("seed")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	seedLedger(t, js)
	nc.Close()
	ns.Shutdown() // the gateway is stopped

	code, out, errOut := runLedger(t, "bill", "--data-dir", dataDir, "--json")
	if code != 0 {
		t.Fatalf("bill --data-dir: exit %d, %s", code, errOut)
	}
	var b ledger.Bill
	if err := json.Unmarshal([]byte(out), &b); err != nil || b.NetMicros != 960_000 || b.Tenant != "" {
		t.Fatalf("bill of every tenant %+v, %v; want net 960000", b, err)
	}
	if code, out, errOut := runLedger(t, "verify", "--data-dir", dataDir); code != 0 || !strings.Contains(out, "4 entries") {
		t.Fatalf("verify --data-dir: exit %d\n%s%s", code, out, errOut)
	}
}

// TestPrintBillGolden: the text bill, with the calls table (cost per call, duplicate ratio
// as a percentage, executions avoided with joined and replayed, saved).
func TestPrintBillGolden(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	charge := func(id, model string, cost int64, completed bool) ledger.Entry {
		return ledger.Entry{ID: id, Kind: ledger.KindCharge, Tenant: "acme", Model: model, InputTokens: 1000, OutputTokens: 100,
			CostMicros: cost, Completed: completed, Currency: "USD", Time: t0.Add(time.Hour)}
	}
	entries := []ledger.Entry{charge("c1", "gpt-4o-mini", 100, true), charge("c2", "gpt-4o-mini", 100, true),
		charge("c3", "gpt-4o-mini", 100, true), charge("c4", "claude-sonnet", 4500, false)}
	tallies := []ledger.TallyReport{{ID: "r1", Tenant: "acme", From: t0, To: t0.Add(2 * time.Hour), Models: []ledger.TallyCounts{
		{Model: "gpt-4o-mini", Joined: 5, Replayed: 2, SavedMicros: 700}}}}
	b, err := ledger.ComputeBill(entries, "acme", t0, t0.AddDate(0, 1, 0), tallies...)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printBill(&out, b)
	testkit.Golden(t, filepath.Join("testdata", "bill.txt"), out.Bytes())
}

// listeningNATS starts an embedded server listening on loopback (as a gateway with
// --nats-listen) in a temp dir, and a JetStream context on it; both end with the test.
func listeningNATS(t *testing.T, ctx context.Context) (*natsrv.Server, jetstream.JetStream) {
	t.Helper()
	ns, err := natsrv.Start(ctx, natsrv.Options{StoreDir: t.TempDir(), Listen: "127.0.0.1:-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := ns.Connect("seed")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return ns, js
}
