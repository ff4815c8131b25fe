package ledger_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/ledgerkit"
	"github.com/oncegate/oncegate/ledger"
)

// p1 tags key as a record key of partition 1.
func p1(key string) string { return partition.P(1).Tagged(key) }

// startParts starts a synced embedded server with the ledger streams of count partitions.
func startParts(t testing.TB, count int) *testkit.JetStream {
	t.Helper()
	srv := testkit.RunJetStream(t, 0)
	for _, p := range partition.All(count) {
		if err := ledger.EnsurePartition(ctxT(t), srv.JS, p, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

// chargeAll appends cs through s, failing the test on an error.
func chargeAll(t testing.TB, s *ledger.Set, cs ...ledger.ChargeInput) []ledger.Entry {
	t.Helper()
	out := make([]ledger.Entry, len(cs))
	for i, c := range cs {
		e, err := s.Charge(ctxT(t), c)
		if err != nil {
			t.Fatalf("charge %s/%s: %v", c.KeyHash, c.JobID, err)
		}
		out[i] = e
	}
	return out
}

// twoPartitionCharges are acme's charges in partitions 0 and 1 and globex's in partition 1.
var twoPartitionCharges = []ledger.ChargeInput{
	{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Attempt: 1, Model: "oncegate-mock", InputTokens: 100_000, OutputTokens: 10_000, Completed: true},
	{Tenant: "acme", KeyHash: p1(k2), JobID: j2, Epoch: 1, Attempt: 1, Model: "oncegate-mock", InputTokens: 200_000, OutputTokens: 20_000, Completed: true},
	{Tenant: "globex", KeyHash: p1(k3), JobID: j3, Epoch: 1, Attempt: 1, Model: "claude-sonnet", InputTokens: 1_000, OutputTokens: 100, Completed: true},
	{Tenant: "acme", KeyHash: p1(k4), JobID: j4, Epoch: 1, Attempt: 1, Model: "oncegate-mock", InputTokens: 300_000, Completed: true},
	{Tenant: "acme", KeyHash: k5, JobID: j5, Epoch: 1, Attempt: 1, Model: "oncegate-mock", InputTokens: 400_000, Completed: true},
}

// TestSetChargesGoToTheirPartition: each charge lands in the stream of its key's partition
// (LEDGER, LEDGER_P1), each partition holds its own chain of each tenant (acme's first entry
// in LEDGER_P1 starts a chain), and every chain verifies.
func TestSetChargesGoToTheirPartition(t *testing.T) {
	srv := startParts(t, 2)
	ctx := ctxT(t)
	s := ledger.NewSet(srv.JS, testPrices, "USD", 2, ledger.WithClock(newStepClock(goldenStart).Now))
	es := chargeAll(t, s, twoPartitionCharges...)

	if got := msgsOf(t, srv.JS, "LEDGER"); got != 2 {
		t.Errorf("LEDGER holds %d entries, want 2 (k1, k5)", got)
	}
	if got := msgsOf(t, srv.JS, "LEDGER_P1"); got != 3 {
		t.Errorf("LEDGER_P1 holds %d entries, want 3", got)
	}
	if es[1].PrevHash != "" || es[3].PrevHash != es[1].Hash || es[4].PrevHash != es[0].Hash {
		t.Errorf("acme's chains: want one per partition (P1 from %s, P0 from %s)", es[1].ID, es[0].ID)
	}
	all, err := s.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 {
		t.Fatalf("the set read %d entries, want 5", len(all))
	}
	r := ledger.Check(all, ledger.VerifyOptions{})
	if err := r.Err(); err != nil {
		t.Fatalf("verify: %v", err)
	}
	type head struct {
		tenant      string
		part, count int
	}
	var heads []head
	for _, h := range r.Heads {
		heads = append(heads, head{h.Tenant, h.Partition, h.Count})
	}
	if want := []head{{"acme", 0, 2}, {"acme", 1, 2}, {"globex", 1, 1}}; !reflect.DeepEqual(heads, want) {
		t.Errorf("heads %+v, want %+v", heads, want)
	}

	// A continuation and a reversal go to the partition of their charge.
	if _, err := s.Continuation(ctx, es[1].ID, ledger.ChargeInput{Attempt: 2, InputTokens: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reverse(ctx, es[3].ID, "refund"); err != nil {
		t.Fatal(err)
	}
	if got := msgsOf(t, srv.JS, "LEDGER_P1"); got != 5 {
		t.Errorf("LEDGER_P1 holds %d entries after a continuation and a reversal, want 5", got)
	}

	// A ledger refuses another partition's key; a set, a key beyond its partitions.
	l0 := s.Ledgers()[0]
	if _, err := l0.Charge(ctx, twoPartitionCharges[1]); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("partition 0's ledger charged a key of partition 1: %v", err)
	}
	c := twoPartitionCharges[0]
	c.KeyHash = partition.P(2).Tagged(k1)
	if _, err := s.Charge(ctx, c); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("a set of 2 partitions charged a key of partition 2: %v", err)
	}
}

// TestPartitionsFromStreams: the partitions are found from the ledger streams present.
func TestPartitionsFromStreams(t *testing.T) {
	srv := startParts(t, 3)
	ctx := ctxT(t)
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LEDGER_PX", Subjects: []string{"x.>"}}); err != nil {
		t.Fatal(err)
	}
	ps, err := ledger.Partitions(ctx, srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	if want := []partition.P{0, 1, 2}; !slices.Equal(ps, want) {
		t.Errorf("Partitions = %v, want %v", ps, want)
	}
	s, err := ledger.OpenSet(ctx, srv.JS, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range s.Ledgers() {
		names = append(names, l.Stream())
	}
	if want := []string{"LEDGER", "LEDGER_P1", "LEDGER_P2"}; !slices.Equal(names, want) {
		t.Errorf("OpenSet's streams %v, want %v", names, want)
	}
	st, err := srv.JS.Stream(ctx, "LEDGER_P2")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; !slices.Equal(cfg.Subjects, []string{"p2.ledger.>"}) || !cfg.DenyDelete || !cfg.DenyPurge {
		t.Errorf("LEDGER_P2: subjects %v, deny delete %v, deny purge %v", cfg.Subjects, cfg.DenyDelete, cfg.DenyPurge)
	}
}

// TestVerifyFindsTamperingInPartition1: an entry forged into LEDGER_P1, or an export whose
// partition 1 entry was edited, removed or rechained after an edit, is found, and said to be in
// partition 1; partition 0's chain is untouched.
func TestVerifyFindsTamperingInPartition1(t *testing.T) {
	srv := startParts(t, 2)
	ctx := ctxT(t)
	s := ledger.NewSet(srv.JS, testPrices, "USD", 2, ledger.WithClock(newStepClock(goldenStart).Now), ledger.WithSecret(testSecret))
	chargeAll(t, s, twoPartitionCharges...)
	entries := func() []ledger.Entry {
		t.Helper()
		es, err := s.Entries(ctx, "", time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	clean := entries()
	keyed := ledger.VerifyOptions{Secret: testSecret}
	if err := ledger.Check(clean, keyed).Err(); err != nil {
		t.Fatalf("the untouched ledger: %v", err)
	}
	at := func(es []ledger.Entry, key string) int {
		return slices.IndexFunc(es, func(e ledger.Entry) bool { return e.KeyHash == key })
	}
	for _, tc := range []struct {
		name string
		edit func([]ledger.Entry) []ledger.Entry
	}{
		{"cost edited", func(es []ledger.Entry) []ledger.Entry {
			es[at(es, p1(k2))].CostMicros = 1
			return es
		}},
		{"entry removed", func(es []ledger.Entry) []ledger.Entry { return slices.Delete(es, at(es, p1(k2)), at(es, p1(k2))+1) }},
		{"rechained without the secret", func(es []ledger.Entry) []ledger.Entry {
			es[at(es, p1(k4))].CostMicros = 1
			return ledgerkit.Rechain(es, "acme", at(es, p1(k4)), nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ledger.Check(tc.edit(slices.Clone(clean)), keyed)
			var ce *ledger.ChainError
			if len(r.Findings) != 1 || !errors.As(r.Findings[0], &ce) || ce.Partition != 1 || ce.Tenant != "acme" {
				t.Fatalf("findings %v: want one, in acme's chain of partition 1", r.Findings)
			}
		})
	}

	// A forged entry published into LEDGER_P1 by hand: a copy of acme's last entry there,
	// with another id and cost, its hash left as it was.
	last, err := srv.JS.Conn().Request("$JS.API.DIRECT.GET.LEDGER_P1.p1."+ledger.Subject("acme"), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var forged map[string]any
	if err := json.Unmarshal(last.Data, &forged); err != nil {
		t.Fatalf("direct get of acme's last entry in LEDGER_P1: %v (%s)", err, last.Data)
	}
	forged["id"] = ledger.ChargeID(p1(k4), j4, 2, 1)
	forged["epoch"], forged["cost_micros"] = 2, 5
	data, err := json.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: "p1." + ledger.Subject("acme"), Data: data}); err != nil {
		t.Fatal(err)
	}
	r := ledger.Check(entries(), keyed)
	var ce *ledger.ChainError
	if len(r.Findings) != 1 || !errors.As(r.Findings[0], &ce) || ce.Partition != 1 || ce.ID != forged["id"] {
		t.Fatalf("forged entry: findings %v, want one at %s in partition 1", r.Findings, forged["id"])
	}
}

// TestSetBillAndExportSumEveryPartition: a bill and an export of a Set count the entries of
// both partitions exactly once, and an export of both verifies and bills the same.
func TestSetBillAndExportSumEveryPartition(t *testing.T) {
	srv := startParts(t, 2)
	ctx := ctxT(t)
	s := ledger.NewSet(srv.JS, testPrices, "USD", 2, ledger.WithClock(newStepClock(goldenStart).Now))
	es := chargeAll(t, s, twoPartitionCharges...)
	if _, err := s.Reverse(ctx, es[3].ID, "refund"); err != nil { // acme, partition 1
		t.Fatal(err)
	}
	var acmeGross, allGross int64
	for _, e := range es {
		allGross += e.CostMicros
		if e.Tenant == "acme" {
			acmeGross += e.CostMicros
		}
	}
	for _, tc := range []struct {
		tenant                   string
		charges                  int
		gross, reversed, net     int64
		completed, reversalCount int
	}{
		{"acme", 4, acmeGross, es[3].CostMicros, acmeGross - es[3].CostMicros, 4, 1},
		{"globex", 1, es[2].CostMicros, 0, es[2].CostMicros, 1, 0},
		{"", 5, allGross, es[3].CostMicros, allGross - es[3].CostMicros, 5, 1},
	} {
		t.Run("tenant="+tc.tenant, func(t *testing.T) {
			b, err := s.Bill(ctx, tc.tenant, time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if b.Charges != tc.charges || b.GrossMicros != tc.gross || b.ReversedMicros != tc.reversed || b.NetMicros != tc.net ||
				b.CompletedCharges != tc.completed || b.Reversals != tc.reversalCount {
				t.Errorf("bill: %d charges, gross %d, reversed %d, net %d, completed %d, reversals %d; want %d, %d, %d, %d, %d, %d",
					b.Charges, b.GrossMicros, b.ReversedMicros, b.NetMicros, b.CompletedCharges, b.Reversals,
					tc.charges, tc.gross, tc.reversed, tc.net, tc.completed, tc.reversalCount)
			}
			var buf bytes.Buffer
			ew, err := ledger.NewExportWriter(&buf, ledger.FormatCSV)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Scan(ctx, tc.tenant, time.Time{}, time.Time{}, ew.Write); err != nil {
				t.Fatal(err)
			}
			if err := ew.Flush(); err != nil {
				t.Fatal(err)
			}
			exported, err := ledger.ReadExport(&buf, ledger.FormatCSV)
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.charges + tc.reversalCount; len(exported) != want {
				t.Errorf("export: %d entries, want %d", len(exported), want)
			}
			if err := ledger.Verify(exported); err != nil {
				t.Errorf("the export does not verify: %v", err)
			}
			fromExport, err := ledger.ComputeBill(exported, tc.tenant, time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			fromExport.Currency = b.Currency
			if !reflect.DeepEqual(fromExport, b) {
				t.Errorf("the export's bill %+v differs from the set's %+v", fromExport, b)
			}
		})
	}
}

// TestSetBudgetAcrossPartitions: a tenant's spend is the sum of its charges in both
// partitions, a reservation is refused past the exact limit, and a settle hold stops counting
// once its job's charge is in the ledger, whichever partition holds it.
func TestSetBudgetAcrossPartitions(t *testing.T) {
	srv := startParts(t, 2)
	ctx := ctxT(t)
	clock := &manualClock{t: time.Date(2026, 5, 2, 9, 0, 0, 0, time.UTC)}
	// Prices: 1 micro per input token.
	s := ledger.NewSet(srv.JS, ledger.Prices{"m": {InputPerMillion: 1_000_000}}, "USD", 2, ledger.WithClock(clock.Now))
	charge := func(key, job string, micros int) {
		t.Helper()
		chargeAll(t, s, ledger.ChargeInput{Tenant: "acme", KeyHash: key, JobID: job, Epoch: 1, Model: "m", InputTokens: micros})
	}
	charge(k1, j1, 400)     // partition 0
	charge(p1(k2), j2, 500) // partition 1
	tbs, err := s.TenantBudgets(map[string]ledger.BudgetLimit{"acme": {Period: ledger.PeriodMonth, Micros: 1_000}})
	if err != nil {
		t.Fatal(err)
	}
	b := tbs["acme"]
	t.Cleanup(b.Close)
	st, err := b.Status(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if st.SpentMicros != 900 {
		t.Fatalf("spent %d, want 900 (400 in partition 0, 500 in partition 1)", st.SpentMicros)
	}
	if _, err := b.ReserveJob(ctx, "acme", j3, 101); !errors.Is(err, ledger.ErrBudgetExceeded) {
		t.Fatalf("reserve 101 at 900/1000: %v, want ErrBudgetExceeded", err)
	}
	release, err := b.ReserveJob(ctx, "acme", j3, 100) // exactly the limit
	if err != nil {
		t.Fatalf("reserve 100 at 900/1000: %v", err)
	}
	if _, err := b.ReserveJob(ctx, "acme", j4, 1); !errors.Is(err, ledger.ErrBudgetExceeded) {
		t.Fatalf("reserve 1 at 900+100/1000: %v, want ErrBudgetExceeded", err)
	}
	release(100) // settled: a hold of 100 stands in for j3's charge
	if st, err = b.Status(ctx, "acme"); err != nil || st.ReservedMicros != 100 || st.SpentMicros != 900 {
		t.Fatalf("after the release: %+v (%v), want spent 900, reserved 100 (the hold)", st, err)
	}
	charge(p1(k3), j3, 100) // j3's charge, in partition 1
	if st, err = b.Status(ctx, "acme"); err != nil || st.ReservedMicros != 0 || st.SpentMicros != 1_000 {
		t.Fatalf("after j3's charge in partition 1: %+v (%v), want spent 1000, reserved 0 (the hold gone, counted once)", st, err)
	}
	if _, err := b.ReserveJob(ctx, "acme", j4, 1); !errors.Is(err, ledger.ErrBudgetExceeded) {
		t.Fatalf("reserve 1 at 1000/1000: %v, want ErrBudgetExceeded", err)
	}
	// A reversal in partition 0 frees its cost.
	if _, err := s.Reverse(ctx, ledger.ChargeID(k1, j1, 1, 0), "refund"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReserveJob(ctx, "acme", j4, 400); err != nil {
		t.Fatalf("reserve 400 after a 400 reversal at 1000/1000: %v", err)
	}
}

// TestSetReconcileAcrossPartitions: an intent of partition 1 charged twice (a zombie epoch and
// the completed one) gets one reversal, in LEDGER_P1; partition 0's intents are left alone;
// a second run appends nothing, and a dry run plans the same.
func TestSetReconcileAcrossPartitions(t *testing.T) {
	srv := startParts(t, 2)
	ctx := ctxT(t)
	s := ledger.NewSet(srv.JS, testPrices, "USD", 2, ledger.WithClock(newStepClock(goldenStart).Now))
	charges := append(slices.Clone(twoPartitionCharges),
		ledger.ChargeInput{Tenant: "acme", KeyHash: p1(k2), JobID: j2, Epoch: 2, Attempt: 1, Model: "oncegate-mock", InputTokens: 200_000}) // j2 again: a zombie's epoch
	es := chargeAll(t, s, charges...)
	all, err := s.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	plan, dups, err := ledger.PlanReconcile(all)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 1 || plan[0].Of.ID != es[5].ID || len(dups) != 1 || dups[0].Kept != es[1].ID {
		t.Fatalf("dry run: plan %+v, duplicates %+v; want %s reversed, %s kept", plan, dups, es[5].ID, es[1].ID)
	}
	rep, err := s.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Appended) != 1 || rep.Appended[0].Refers != es[5].ID || rep.ReversedMicros != es[5].CostMicros || rep.Entries != 6 {
		t.Fatalf("reconcile: %+v; want one reversal of %s, 6 entries read", rep, es[5].ID)
	}
	if len(rep.Partitions) != 2 || rep.Partitions[0].Entries != 2 || len(rep.Partitions[0].Appended) != 0 ||
		rep.Partitions[1].Partition != 1 || rep.Partitions[1].Entries != 4 || len(rep.Partitions[1].Appended) != 1 {
		t.Errorf("per partition: %+v", rep.Partitions)
	}
	if got := msgsOf(t, srv.JS, "LEDGER_P1"); got != 5 {
		t.Errorf("LEDGER_P1 holds %d entries, want 5 (4 charges and the reversal)", got)
	}
	if rep, err = s.Reconcile(ctx); err != nil || len(rep.Appended) != 0 {
		t.Fatalf("second run: %+v, %v; want nothing appended", rep, err)
	}
	b, err := s.Bill(ctx, "acme", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if want := es[0].CostMicros + es[1].CostMicros + es[3].CostMicros + es[4].CostMicros; b.NetMicros != want {
		t.Errorf("acme's net %d, want %d (j2 once)", b.NetMicros, want)
	}
}

// TestHeadsOfPartitions: a heads file holds a tenant once per partition; the same tenant twice
// in one partition, or a partition out of range, is refused; a head of partition 0 is written
// without its partition, as before partitions (a file written then still reads, and its MAC
// still matches).
func TestHeadsOfPartitions(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		heads []ledger.Head
		ok    bool
	}{
		{"one per partition", []ledger.Head{{Tenant: "acme", Count: 1, Hash: hash}, {Tenant: "acme", Partition: 1, Count: 1, Hash: hash}}, true},
		{"twice in partition 1", []ledger.Head{{Tenant: "acme", Partition: 1, Count: 1, Hash: hash}, {Tenant: "acme", Partition: 1, Count: 2, Hash: hash}}, false},
		{"partition out of range", []ledger.Head{{Tenant: "acme", Partition: partition.Max, Count: 1, Hash: hash}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := ledger.WriteHeads(&buf, ledger.NewHeads(tc.heads, at, testSecret)); err != nil {
				t.Fatal(err)
			}
			h, err := ledger.ReadHeads(&buf)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ledger.ErrCorrupt)) {
				t.Fatalf("ReadHeads: %v, want ok %v", err, tc.ok)
			}
			if err == nil && !reflect.DeepEqual(h.Heads, tc.heads) {
				t.Errorf("read back %+v, want %+v", h.Heads, tc.heads)
			}
		})
	}
	var buf bytes.Buffer
	if err := ledger.WriteHeads(&buf, ledger.NewHeads([]ledger.Head{{Tenant: "acme", Count: 1, Hash: hash, Time: at}}, at, nil)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "partition") {
		t.Errorf("a head of partition 0 names its partition:\n%s", buf.String())
	}
}
