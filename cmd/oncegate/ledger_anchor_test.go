package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/ledgerkit"
	"github.com/oncegate/oncegate/ledger"
)

var cliSecret = strings.Repeat("k", 40)

// runLedgerEnv is runLedger with an environment.
func runLedgerEnv(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, append([]string{"ledger"}, args...), &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

func writeExport(t *testing.T, es []ledger.Entry) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "export.jsonl")
	var buf bytes.Buffer
	if err := ledger.WriteExport(&buf, ledger.FormatJSONL, es); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeHeads(t *testing.T, es []ledger.Entry, secret []byte) string {
	t.Helper()
	r := ledger.Check(es, ledger.VerifyOptions{Secret: secret})
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	var buf bytes.Buffer
	if err := ledger.WriteHeads(&buf, ledger.NewHeads(r.Heads, time.Now(), secret)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "heads.json")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// goldenExport is the clean golden export of the ledger package's tests.
func goldenExport(t *testing.T) []ledger.Entry {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "testdata", "ledger", "export-clean.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es, err := ledger.ReadExport(f, ledger.FormatJSONL)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// TestLedgerVerifyHeads: verify --heads on tampered copies of the golden export, one line per
// finding and exit 1; the clean one, and one grown since the anchor, exit 0.
func TestLedgerVerifyHeads(t *testing.T) {
	golden := goldenExport
	tests := []struct {
		name   string
		build  func(t *testing.T) (export, heads string)
		env    map[string]string
		code   int
		stdout string
		stderr []string
	}{
		{"clean", func(t *testing.T) (string, string) {
			es := golden(t)
			return writeExport(t, es), writeHeads(t, es, nil)
		}, nil, 0, "2 tenants anchored, 0 entries appended since", nil},
		{"appended after the anchor", func(t *testing.T) (string, string) {
			es := golden(t)
			return writeExport(t, es), writeHeads(t, es[:4], nil)
		}, nil, 0, "2 tenants anchored, 5 entries appended since", nil},
		{"truncated", func(t *testing.T) (string, string) {
			es := golden(t)
			return writeExport(t, es[:len(es)-1]), writeHeads(t, es, nil)
		}, nil, 1, "", []string{`tenant "acme": 6 entries, anchored with 7 entries`, "cut from the end", "1 findings"}},
		{"tenant removed", func(t *testing.T) (string, string) {
			es := golden(t)
			var acme []ledger.Entry
			for _, e := range es {
				if e.Tenant == "acme" {
					acme = append(acme, e)
				}
			}
			return writeExport(t, acme), writeHeads(t, es, nil)
		}, nil, 1, "", []string{`tenant "globex"`, "the tenant was removed"}},
		{"recomputed after an edit", func(t *testing.T) (string, string) {
			es := golden(t)
			h := writeHeads(t, es, nil)
			es[2].CostMicros = 1
			return writeExport(t, ledgerkit.Rechain(es, "acme", 2, nil)), h
		}, nil, 1, "", []string{`tenant "acme": entry 7 has hash`, "recomputed after an edit"}},
		{"keyed, no secret", func(t *testing.T) (string, string) {
			es := ledgerkit.Rechain(ledgerkit.Rechain(golden(t), "acme", 0, []byte(cliSecret)), "globex", 0, []byte(cliSecret))
			return writeExport(t, es), writeHeads(t, es, []byte(cliSecret))
		}, nil, exitUnchecked, "chain links intact, 9 keyed entries not checked",
			[]string{"cannot check 9 keyed entries without the ledger secret", "cannot check the MAC"}},
		{"keyed, with the secret", func(t *testing.T) (string, string) {
			es := ledgerkit.Rechain(ledgerkit.Rechain(golden(t), "acme", 0, []byte(cliSecret)), "globex", 0, []byte(cliSecret))
			return writeExport(t, es), writeHeads(t, es, []byte(cliSecret))
		}, map[string]string{"ONCEGATE_LEDGER_SECRET": cliSecret}, 0, "its MAC checked", nil},
		{"keyed, recomputed without the key", func(t *testing.T) (string, string) {
			es := ledgerkit.Rechain(ledgerkit.Rechain(golden(t), "acme", 0, []byte(cliSecret)), "globex", 0, []byte(cliSecret))
			es[2].CostMicros = 1
			return writeExport(t, ledgerkit.Rechain(es, "acme", 2, nil)), ""
		}, map[string]string{"ONCEGATE_LEDGER_SECRET": cliSecret}, 1, "", []string{"entry 2", "an unkeyed entry after a keyed one"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			export, heads := tt.build(t)
			args := []string{"verify", export}
			if heads != "" {
				args = append(args, "--heads", heads)
			}
			code, out, errOut := runLedgerEnv(t, tt.env, args...)
			if code != tt.code || !strings.Contains(out, tt.stdout) {
				t.Fatalf("exit %d (want %d), stdout %q (want %q), stderr %q", code, tt.code, out, tt.stdout, errOut)
			}
			for _, w := range tt.stderr {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, errOut)
				}
			}
			if tt.code == 1 { // one line per finding, then the count
				lines := strings.Split(strings.TrimSpace(errOut), "\n")
				if want := "findings"; !strings.HasSuffix(lines[len(lines)-1], want) {
					t.Errorf("last stderr line %q, want the count of findings", lines[len(lines)-1])
				}
			}
		})
	}

	code, _, errOut := runLedgerEnv(t, map[string]string{"ONCEGATE_LEDGER_SECRET": "short"}, "verify", writeExport(t, golden(t)))
	if code != 2 || !strings.Contains(errOut, "at least 32") {
		t.Fatalf("a short secret: exit %d, stderr %q", code, errOut)
	}
	bad := filepath.Join(t.TempDir(), "heads.json")
	if err := os.WriteFile(bad, []byte(`{"version":9}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runLedger(t, "verify", writeExport(t, golden(t)), "--heads", bad); code != 1 || !strings.Contains(errOut, "version 9") {
		t.Fatalf("a bad heads file: exit %d, stderr %q", code, errOut)
	}
}

// TestLedgerHeadLive: a keyed ledger on a real NATS (listening, as a gateway with
// --nats-listen): `ledger head --out` anchors it, `verify live --heads` passes and keeps
// passing as it grows; with a tenant's entries gone from a rebuilt stream, it fails.
func TestLedgerHeadLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns, js := listeningNATS(t, ctx)
	if err := ledger.EnsureStream(ctx, js); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(js, ledger.Prices{"*": {InputPerMillion: 1_000_000}}, "USD", ledger.WithSecret([]byte(cliSecret)))
	charge := func(tenant, key string) {
		t.Helper()
		if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: tenant, KeyHash: key, JobID: "01JNV6Q5M8X3Z9A4B7C2D1E0F1", Epoch: 1,
			Model: "m", InputTokens: 10, Completed: true}); err != nil {
			t.Fatal(err)
		}
	}
	charge("acme", "aaaa")
	charge("globex", "bbbb")
	charge("acme", "cccc")
	url := ns.ClientURL()
	env := map[string]string{"ONCEGATE_LEDGER_SECRET": cliSecret}
	heads := filepath.Join(t.TempDir(), "heads.json")

	code, out, errOut := runLedgerEnv(t, env, "head", "--nats-url", url, "--out", heads)
	if code != 0 || !strings.Contains(out, "heads of 2 tenants, 3 entries, with an HMAC") {
		t.Fatalf("head: exit %d\n%s%s", code, out, errOut)
	}
	h, err := readHeadsFile(heads)
	if err != nil || len(h.Heads) != 2 || h.Heads[0].Tenant != "acme" || h.Heads[0].Count != 2 || h.Heads[0].Seq != 3 ||
		!strings.HasPrefix(h.Heads[0].Hash, ledger.KeyedPrefix) || h.MAC == "" {
		t.Fatalf("heads file %+v, %v", h, err)
	}
	code, out, errOut = runLedgerEnv(t, env, "verify", "live", "--nats-url", url, "--heads", heads, "--require-keyed")
	if code != 0 || !strings.Contains(out, "3 keyed entries checked with the ledger secret") || !strings.Contains(out, "2 tenants anchored, 0 entries appended since") {
		t.Fatalf("verify live --heads: exit %d\n%s%s", code, out, errOut)
	}
	charge("globex", "dddd")
	if code, out, errOut := runLedgerEnv(t, env, "verify", "--nats-url", url, "--heads", heads); code != 0 || !strings.Contains(out, "1 entries appended since") {
		t.Fatalf("verify after an append: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runLedger(t, "verify", "--nats-url", url, "--heads", heads); code != exitUnchecked || !strings.Contains(errOut, "cannot check 4 keyed entries") {
		t.Fatalf("verify without the secret: exit %d (want %d)\n%s%s", code, exitUnchecked, out, errOut)
	}

	// globex's entries gone: the stream deleted and rebuilt from acme's own messages.
	st, err := js.Stream(ctx, ledger.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	var keep [][2]string
	for _, seq := range []uint64{1, 3} {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, [2]string{m.Subject, string(m.Data)})
	}
	if err := js.DeleteStream(ctx, ledger.StreamName); err != nil {
		t.Fatal(err)
	}
	testkit.Recreate(t, func() error { return ledger.EnsureStream(ctx, js) })
	for _, m := range keep {
		if _, err := js.Publish(ctx, m[0], []byte(m[1])); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut = runLedgerEnv(t, env, "verify", "--nats-url", url, "--heads", heads)
	if code != 1 || !strings.Contains(errOut, `tenant "globex": anchored with 1 entries to seq 2`) || !strings.Contains(errOut, "the tenant was removed") {
		t.Fatalf("verify, globex removed: exit %d\n%s%s", code, out, errOut)
	}
	t.Log(errOut)
}

// TestLedgerVerifyRotated: an export keyed under an old secret and, from its fifth entry, a
// new one verifies with --config naming the new secret and the old one in
// ledger.retired_secrets; with the new secret alone the old entries are findings.
func TestLedgerVerifyRotated(t *testing.T) {
	es := goldenExport(t)
	oldSecret := strings.Repeat("o", 40)
	for _, tenant := range []string{"acme", "globex"} {
		es = ledgerkit.Rechain(ledgerkit.Rechain(es, tenant, 0, []byte(oldSecret)), tenant, 4, []byte(cliSecret))
	}
	export := writeExport(t, es)
	cfg := filepath.Join(t.TempDir(), "oncegate.yaml")
	if err := os.WriteFile(cfg, []byte(`ledger:
  secret: "`+cliSecret+`"
  retired_secrets:
    - {secret: "`+oldSecret+`", until: 2026-03-01T10:00:03Z}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runLedgerEnv(t, nil, "verify", export, "--config", cfg)
	if code != 0 || !strings.Contains(out, "9 keyed entries checked with the ledger secret") {
		t.Fatalf("with the retired secret: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runLedgerEnv(t, map[string]string{"ONCEGATE_LEDGER_SECRET": cliSecret}, "verify", export)
	if code != 1 || !strings.Contains(errOut, "keyed hash mismatch") {
		t.Fatalf("with the new secret alone: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
