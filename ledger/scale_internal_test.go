package ledger

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestScale measures Bill, Entries and Reconcile on large ledgers. It is skipped under -short
// and unless ONCEGATE_LEDGER_SCALE lists the sizes:
//
//	ONCEGATE_LEDGER_SCALE=100000,1000000 go test -run TestScale -v -timeout 30m ./ledger/
//
// The ledger is bulk-loaded (valid chains, 100 tenants, entries over 90 days, 1% of intents
// charged twice) on an unsynced server, since the load is not what is measured; Reconcile's
// reversals go through the real append path.
func TestScale(t *testing.T) {
	sizes := os.Getenv("ONCEGATE_LEDGER_SCALE")
	if testing.Short() || sizes == "" {
		t.Skip("set ONCEGATE_LEDGER_SCALE=100000,1000000 to measure (not under -short)")
	}
	for _, s := range splitComma(sizes) {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			measurePlanner(t, n) // first: no server in the heap
			measureScale(t, n)
		})
	}
}

// measurePlanner is the memory Reconcile keeps between runs, alone (no server in the heap).
func measurePlanner(t *testing.T, n int) {
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapInuse)
	}
	before := heap()
	p := newPlanner(0)
	for i := 0; i < n; i++ {
		e := Entry{Kind: KindCharge, Tenant: "tenant-" + strconv.Itoa(i%100), KeyHash: fmt.Sprintf("%032x", i), JobID: "J" + strconv.Itoa(i), Epoch: 1, Seq: uint64(i + 1)}
		e.ID = ChargeID(e.KeyHash, e.JobID, 1, 1)
		if err := p.add(&e); err != nil {
			t.Fatal(err)
		}
	}
	p.clean()
	t.Logf("n=%d: Reconcile summary kept between runs: %d MB (%d bytes per intent)", n, (heap()-before)>>20, (heap()-before)/int64(n))
	runtime.KeepAlive(p)
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

func measureScale(t *testing.T, n int) {
	srv := testkit.RunJetStream(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := EnsureStream(ctx, srv.JS); err != nil {
		t.Fatal(err)
	}
	const tenants = 100
	begin := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	span := 90 * 24 * time.Hour
	prices := Prices{"gpt-4o-mini": {InputPerMillion: 150_000, OutputPerMillion: 600_000}}
	heads := make([]string, tenants)
	loadStart := time.Now()
	dups := 0
	for i := 0; i < n; i++ {
		intent, epoch := i, 1
		if i%100 == 99 { // 1%: a second charge (next epoch) of the previous row's intent
			intent, epoch = i-1, 2
			dups++
		}
		tn := intent % tenants
		e := Entry{Kind: KindCharge, Tenant: "tenant-" + strconv.Itoa(tn), KeyHash: fmt.Sprintf("%032x", intent), JobID: "J" + strconv.Itoa(intent),
			Epoch: epoch, Attempt: 1, Model: "gpt-4o-mini", Backend: "openai", InputTokens: 500 + i%1000, OutputTokens: 100 + i%300,
			Completed: epoch == 2, Currency: "USD", Time: begin.Add(time.Duration(int64(span) / int64(n) * int64(i))), PrevHash: heads[tn]}
		e.ID = ChargeID(e.KeyHash, e.JobID, e.Epoch, e.Attempt)
		e.CostMicros = prices.Cost(e.Model, e.InputTokens, e.OutputTokens)
		e.Hash = HashOf(&e)
		heads[tn] = e.Hash
		if _, err := srv.JS.PublishMsgAsync(&nats.Msg{Subject: Subject(e.Tenant), Data: encodeStored(&e)}); err != nil {
			t.Fatal(err)
		}
		if i%20_000 == 19_999 || i == n-1 {
			select {
			case <-srv.JS.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
	t.Logf("n=%d: bulk load %v (%d duplicate charges)", n, time.Since(loadStart).Round(time.Millisecond), dups)

	l := New(srv.JS, prices, "USD")
	// Times are wall clock for the whole call (the in-process server's work included).
	measure := func(name string, f func() string) {
		start := time.Now()
		what := f()
		t.Logf("n=%d: %-44s %9v  %s", n, name, time.Since(start).Round(time.Millisecond), what)
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	measure("Bill every tenant, all time", func() string {
		b, err := l.Bill(ctx, "", time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("(%d charges, net %s)", b.Charges, FormatMicros(b.NetMicros))
	})
	measure("Bill one tenant, one month", func() string {
		b, err := l.Bill(ctx, "tenant-7", begin.AddDate(0, 1, 0), begin.AddDate(0, 2, 0))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("(%d charges)", b.Charges)
	})
	before := heap()
	measure("Reconcile (1% duplicates)", func() string {
		rep, err := l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Appended) != dups {
			t.Fatalf("%d reversals, want %d", len(rep.Appended), dups)
		}
		return fmt.Sprintf("(%d entries read, %d reversals appended)", rep.Entries, len(rep.Appended))
	})
	t.Logf("n=%d: heap growth over the first Reconcile: %d MB (its summary, the chains loaded to append, and the in-process server's caches)", n, (int64(heap())-int64(before))>>20)
	measure("Reconcile again, same process", func() string {
		rep, err := l.Reconcile(ctx)
		if err != nil || len(rep.Appended) != 0 {
			t.Fatalf("%+v, %v", rep.Appended, err)
		}
		return fmt.Sprintf("(%d new entries read)", rep.Entries)
	})
	measure("Reconcile in a new process (CLI)", func() string {
		rep, err := New(srv.JS, prices, "USD").Reconcile(ctx)
		if err != nil || len(rep.Appended) != 0 {
			t.Fatalf("%+v, %v", rep.Appended, err)
		}
		return fmt.Sprintf("(%d entries read)", rep.Entries)
	})
	measure("Entries + Verify, all", func() string {
		es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(es); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("(%d entries)", len(es))
	})
	for _, h := range []time.Duration{0, time.Nanosecond} {
		fresh := New(srv.JS, prices, "USD", WithDedupHorizon(h))
		measure(fmt.Sprintf("first Charge of a tenant, horizon %v", h), func() string {
			_, err := fresh.Charge(ctx, ChargeInput{Tenant: "tenant-3", KeyHash: "fresh", JobID: "J", Epoch: 1, Attempt: int(h), Model: "gpt-4o-mini", InputTokens: 1})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("(%d entries in the tenant, all older than a 1ns horizon)", n/tenants)
		})
	}
	b, err := NewBudgets(New(srv.JS, prices, "USD"), PeriodMonth, map[string]int64{"tenant-5": 1 << 60})
	if err != nil {
		t.Fatal(err)
	}
	measure("first Budgets.Reserve of a tenant", func() string {
		if _, err := b.Reserve(ctx, "tenant-5", 1); err != nil {
			t.Fatal(err)
		}
		return "(reads the entries stored since the period began: here all)"
	})
	measure("next Budgets.Reserve", func() string {
		if _, err := b.Reserve(ctx, "tenant-5", 1); err != nil {
			t.Fatal(err)
		}
		return "(nothing new)"
	})
	st, err := srv.JS.Stream(ctx, StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(allSubjects))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("n=%d: stream %d msgs, %d MB on disk", n, info.State.Msgs, info.State.Bytes>>20)
}
