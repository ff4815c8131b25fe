package ledger_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

func TestPricesCost(t *testing.T) {
	p := ledger.Prices{
		"m":   {InputPerMillion: 150_000, OutputPerMillion: 600_000},
		"big": {InputPerMillion: 1 << 62, OutputPerMillion: 1 << 62},
		"*":   {InputPerMillion: 1_000_000, OutputPerMillion: 1_000_000},
	}
	tests := []struct {
		name    string
		model   string
		in, out int
		want    int64
	}{
		{"zero", "m", 0, 0, 0},
		{"one million each", "m", 1_000_000, 1_000_000, 750_000},
		{"rounds half up", "m", 10, 0, 2}, // 1.5 micros
		{"rounds down", "m", 3, 0, 0},     // 0.45 micros
		{"negative is zero", "m", -5, 0, 0},
		{"catch-all price", "other", 2_000_000, 0, 2_000_000},
		{"saturates", "big", 1 << 40, 1 << 40, 1<<63 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Cost(tt.model, tt.in, tt.out); got != tt.want {
				t.Fatalf("Cost(%s, %d, %d) = %d, want %d", tt.model, tt.in, tt.out, got, tt.want)
			}
		})
	}
	if got := (ledger.Prices{"m": {1, 1}}).Cost("unpriced", 1_000_000, 0); got != 0 {
		t.Fatalf("unpriced model cost %d, want 0", got)
	}
}

func TestSubjectHidesTenant(t *testing.T) {
	for _, tenant := range []string{"acme", "a.b.*.>", "with space", "ünïcode", ""} {
		s := ledger.Subject(tenant)
		if strings.Count(s, ".") != 1 || strings.ContainsAny(s[len("ledger."):], "*> ") || len(s) != len("ledger.")+32 {
			t.Errorf("Subject(%q) = %q: want ledger.<32 hex>", tenant, s)
		}
	}
	if ledger.Subject("a") == ledger.Subject("b") {
		t.Fatal("two tenants share a subject")
	}
}

// TestStreamProtections: deletes, purges and rollups are refused; EnsureStream is idempotent,
// repairs a weakened stream and refuses one it cannot repair.
func TestStreamProtections(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD")
	for i := range 3 {
		if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Attempt: i, Model: "gpt-4o-mini", InputTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := srv.JS.Stream(ctx, ledger.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	refusals := []struct {
		name string
		do   func() error
	}{
		{"DeleteMsg", func() error { return st.DeleteMsg(ctx, 2) }},
		{"SecureDeleteMsg", func() error { return st.SecureDeleteMsg(ctx, 2) }},
		{"Purge", func() error { return st.Purge(ctx) }},
		{"Purge subject", func() error { return st.Purge(ctx, jetstream.WithPurgeSubject(ledger.Subject("acme"))) }},
		{"Purge keep 1", func() error { return st.Purge(ctx, jetstream.WithPurgeKeep(1)) }},
		{"rollup", func() error {
			m := nats.NewMsg(ledger.Subject("acme"))
			m.Data = []byte("{}")
			m.Header.Set("Nats-Rollup", "sub")
			_, err := srv.JS.PublishMsg(ctx, m)
			return err
		}},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(); err == nil {
				t.Fatalf("%s on LEDGER succeeded; want refused", tt.name)
			}
		})
	}
	if n := streamMsgs(t, srv.JS); n != 3 {
		t.Fatalf("stream holds %d entries after the refused deletes, want 3", n)
	}
	if err := ledger.EnsureStream(ctx, srv.JS); err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if !c.DenyDelete || !c.DenyPurge || c.AllowRollup || c.Discard != jetstream.DiscardNew || c.MaxAge != 0 ||
		c.Storage != jetstream.FileStorage || c.Duplicates != ledger.DuplicateWindow || c.MaxMsgs != -1 || c.MaxBytes != -1 {
		t.Fatalf("stream config %+v lacks a protection", c)
	}
}

func TestEnsureStreamRepairs(t *testing.T) {
	tests := []struct {
		name    string
		cfg     jetstream.StreamConfig
		wantErr error
	}{
		{"weakened", jetstream.StreamConfig{Name: ledger.StreamName, Subjects: []string{"ledger.>"}, Storage: jetstream.FileStorage,
			MaxAge: time.Hour, Discard: jetstream.DiscardOld, MaxMsgsPerSubject: 10, Duplicates: time.Second, AllowRollup: true}, nil},
		{"stricter kept", jetstream.StreamConfig{Name: ledger.StreamName, Subjects: []string{"ledger.>"}, Storage: jetstream.FileStorage,
			Discard: jetstream.DiscardNew, DenyDelete: true, DenyPurge: true, Duplicates: 24 * time.Hour, MaxMsgs: 1_000_000}, nil},
		{"memory", jetstream.StreamConfig{Name: ledger.StreamName, Subjects: []string{"ledger.>"}, Storage: jetstream.MemoryStorage}, ledger.ErrStreamConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := testkit.RunJetStream(t, 0)
			ctx := ctxT(t)
			if _, err := srv.JS.CreateStream(ctx, tt.cfg); err != nil {
				t.Fatal(err)
			}
			err := ledger.EnsureStream(ctx, srv.JS)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("EnsureStream: %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			st, err := srv.JS.Stream(ctx, ledger.StreamName)
			if err != nil {
				t.Fatal(err)
			}
			c := st.CachedInfo().Config
			if !c.DenyDelete || !c.DenyPurge || c.AllowRollup || c.Discard != jetstream.DiscardNew || c.MaxAge != 0 || c.MaxMsgsPerSubject != -1 {
				t.Fatalf("not repaired: %+v", c)
			}
			if c.Duplicates < tt.cfg.Duplicates || c.Duplicates < ledger.DuplicateWindow {
				t.Fatalf("duplicate window %v lowered (was %v)", c.Duplicates, tt.cfg.Duplicates)
			}
			if tt.cfg.MaxMsgs > 0 && c.MaxMsgs != tt.cfg.MaxMsgs {
				t.Fatalf("MaxMsgs %d changed (was %d)", c.MaxMsgs, tt.cfg.MaxMsgs)
			}
		})
	}
}

// TestChargeTwice: a charge published again — by the same process, after a restart, or by a
// process whose view of the chain is stale (the first one crashed before its ack was
// processed, the job was redelivered elsewhere) — is one entry.
func TestChargeTwice(t *testing.T) {
	in := ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Attempt: 1, Model: "gpt-4o-mini", Backend: "openai",
		InputTokens: 1200, OutputTokens: 350, Completed: true, Fence: 7}
	tests := []struct {
		name string
		// second returns the ledger that charges again, given the first one.
		second func(t *testing.T, srv *testkit.JetStream, first *ledger.Ledger) *ledger.Ledger
	}{
		{"same process", func(t *testing.T, _ *testkit.JetStream, first *ledger.Ledger) *ledger.Ledger { return first }},
		{"after a restart", func(t *testing.T, srv *testkit.JetStream, _ *ledger.Ledger) *ledger.Ledger {
			_, js := srv.Conn(t)
			return ledger.New(js, testPrices, "USD")
		}},
		{"stale process", nil}, // built below: it loads the chain before the first charge
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := start(t)
			ctx := ctxT(t)
			first := ledger.New(srv.JS, testPrices, "USD")
			var stale *ledger.Ledger
			if tt.second == nil {
				_, js := srv.Conn(t)
				stale = ledger.New(js, testPrices, "USD")
				// Load its view of acme's chain (one unrelated entry), so the charge below is news to it.
				if _, err := stale.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k2, JobID: j2, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 1}); err != nil {
					t.Fatal(err)
				}
			}
			e1, err := first.Charge(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			second := stale
			if tt.second != nil {
				second = tt.second(t, srv, first)
			}
			again := in
			again.Fence = 9 // a sweep or a redelivery holds another revision: still the same charge
			e2, err := second.Charge(ctx, again)
			if err != nil {
				t.Fatal(err)
			}
			if e1.ID != e2.ID || e1.Seq != e2.Seq || e1.Hash != e2.Hash || e2.Fence != 7 {
				t.Fatalf("second charge %+v, want the first %+v", e2, e1)
			}
			es, err := first.Entries(ctx, "acme", time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range es {
				if e.ID == e1.ID {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d entries with id %s, want 1", n, e1.ID)
			}
			if err := ledger.Verify(es); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestChargeInvalid(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD")
	ok := ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 1}
	tests := []struct {
		name   string
		mutate func(*ledger.ChargeInput)
		want   error
	}{
		{"empty tenant", func(c *ledger.ChargeInput) { c.Tenant = "" }, ledger.ErrInvalid},
		{"key hash with a dot", func(c *ledger.ChargeInput) { c.KeyHash = "a.b" }, ledger.ErrInvalid},
		{"job id with a space", func(c *ledger.ChargeInput) { c.JobID = "a b" }, ledger.ErrInvalid},
		{"epoch 0", func(c *ledger.ChargeInput) { c.Epoch = 0 }, ledger.ErrInvalid},
		{"negative tokens", func(c *ledger.ChargeInput) { c.OutputTokens = -1 }, ledger.ErrInvalid},
		{"no usage", func(c *ledger.ChargeInput) { c.InputTokens = 0 }, ledger.ErrNoUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			if _, err := l.Charge(ctx, c); !errors.Is(err, tt.want) {
				t.Fatalf("Charge: %v, want %v", err, tt.want)
			}
		})
	}
	if n := streamMsgs(t, srv.JS); n != 0 {
		t.Fatalf("%d entries written by refused charges", n)
	}
	if _, err := l.Continuation(ctx, "charge.nope.nope.1.1", ledger.ChargeInput{Tenant: "acme", InputTokens: 1}); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("continuation of an unknown charge: %v, want ErrNotFound", err)
	}
	if _, err := l.Reverse(ctx, "charge.nope.nope.1.1", "x"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("reversal of an unknown charge: %v, want ErrNotFound", err)
	}
}

// TestFencing: a writer whose fencing token no longer holds appends nothing.
func TestFencing(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD")
	errLost := errors.New("record revision moved on")
	_, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 5,
		Fence: 3, Expect: func(context.Context) error { return errLost }})
	if !errors.Is(err, ledger.ErrFenced) || !errors.Is(err, errLost) {
		t.Fatalf("Charge with a lost fence: %v, want ErrFenced wrapping the Expect error", err)
	}
	if n := streamMsgs(t, srv.JS); n != 0 {
		t.Fatalf("%d entries written by a fenced writer", n)
	}
	calls := 0
	e, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 5,
		Fence: 3, Expect: func(context.Context) error { calls++; return nil }})
	if err != nil || calls != 1 || e.Fence != 3 {
		t.Fatalf("Charge with a valid fence: %+v, %v (expect called %d times)", e, err, calls)
	}
}

// TestDoubleExecution: two charges for one intent (two epochs) → Reconcile reverses one (and
// its continuations); the intent nets one execution; a second Reconcile appends nothing.
func TestDoubleExecution(t *testing.T) {
	type charge struct {
		epoch      int
		completed  bool
		in, out    int
		contTokens int    // a continuation of this charge, if > 0
		keyHash    string // k3 when empty
	}
	tests := []struct {
		name     string
		charges  []charge
		keep     int // index of the charge that must stand
		reversed int // number of reversals Reconcile appends
	}{
		{"zombie then completed takeover", []charge{{1, false, 900, 400, 120, ""}, {2, true, 900, 410, 0, ""}}, 1, 2},
		{"completed then late zombie", []charge{{2, true, 900, 410, 0, ""}, {1, false, 900, 400, 0, ""}}, 0, 1},
		{"none known completed keeps the first", []charge{{1, false, 900, 400, 0, ""}, {2, false, 800, 300, 50, ""}, {3, false, 700, 200, 0, ""}}, 0, 3},
		// One execution charged again under another key hash (an archived copy of an auto
		// key's record, issue 34): one charge per job id, whatever key it was billed under.
		{"one job under two key hashes", []charge{{1, true, 900, 400, 0, ""}, {1, true, 900, 400, 0, "archived-copy"}}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := start(t)
			ctx := ctxT(t)
			l := ledger.New(srv.JS, testPrices, "USD")
			// An unrelated intent of the same tenant must stay untouched.
			other, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k2, JobID: j2, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 10, Completed: true})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			execCost := make([]int64, len(tt.charges))
			for i, c := range tt.charges {
				key := cmp.Or(c.keyHash, k3)
				e, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: key, JobID: j3, Epoch: c.epoch, Attempt: 1, Model: "gpt-4o-mini",
					InputTokens: c.in, OutputTokens: c.out, Completed: c.completed})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, e.ID)
				execCost[i] = e.CostMicros
				if c.contTokens > 0 {
					ce, err := l.Continuation(ctx, e.ID, ledger.ChargeInput{Attempt: 2, InputTokens: c.in + c.out, OutputTokens: c.contTokens})
					if err != nil {
						t.Fatal(err)
					}
					execCost[i] += ce.CostMicros
				}
			}
			rep, err := l.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Appended) != tt.reversed || len(rep.Duplicates) != 1 || rep.Duplicates[0].Kept != ids[tt.keep] {
				t.Fatalf("report %+v: want %d reversals keeping %s", rep, tt.reversed, ids[tt.keep])
			}
			for _, r := range rep.Appended {
				if r.Refers == ids[tt.keep] || r.Refers == other.ID || !strings.HasPrefix(r.Reason, ledger.ReasonDuplicate) {
					t.Fatalf("reversal %+v of an entry that stands", r)
				}
			}
			bill, err := l.Bill(ctx, "acme", time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if want := execCost[tt.keep] + other.CostMicros; bill.NetMicros != want {
				t.Fatalf("net %d, want one execution (%d) plus the other intent (%d)", bill.NetMicros, execCost[tt.keep], other.CostMicros)
			}
			again, err := l.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(again.Appended) != 0 || len(again.Duplicates) != 0 {
				t.Fatalf("second Reconcile appended %d reversals (%+v)", len(again.Appended), again)
			}
			// Another process reconciling the same ledger agrees.
			_, js := srv.Conn(t)
			third, err := ledger.New(js, testPrices, "USD").Reconcile(ctx)
			if err != nil || len(third.Appended) != 0 {
				t.Fatalf("Reconcile in another process: %+v, %v", third, err)
			}
			es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if err := ledger.Verify(es); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestContinuationAfterReversal: a continuation appended after its charge was reversed as a
// duplicate is reversed by the next Reconcile.
func TestContinuationAfterReversal(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD")
	z, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k3, JobID: j3, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k3, JobID: j3, Epoch: 2, Model: "gpt-4o-mini", InputTokens: 100, Completed: true}); err != nil {
		t.Fatal(err)
	}
	if rep, err := l.Reconcile(ctx); err != nil || len(rep.Appended) != 1 {
		t.Fatalf("first Reconcile: %+v, %v", rep, err)
	}
	c, err := l.Continuation(ctx, z.ID, ledger.ChargeInput{Attempt: 2, InputTokens: 100, OutputTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Reconcile(ctx)
	if err != nil || len(rep.Appended) != 1 || rep.Appended[0].Refers != c.ID {
		t.Fatalf("second Reconcile: %+v, %v; want the late continuation reversed", rep, err)
	}
}

func TestReverse(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	l := ledger.New(srv.JS, testPrices, "USD")
	c, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "claude-sonnet", InputTokens: 1000, OutputTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	_, js := srv.Conn(t)
	other := ledger.New(js, testPrices, "USD") // knows no chain: finds the charge by scanning
	r1, err := other.Reverse(ctx, c.ID, "refund: customer complaint")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Reverse(ctx, c.ID, "a second refund")
	if err != nil {
		t.Fatal(err)
	}
	if r1.ID != ledger.ReversalID(c.ID) || r1.Seq != r2.Seq || r2.Reason != "refund: customer complaint" || r1.CostMicros != c.CostMicros {
		t.Fatalf("reversals %+v / %+v: want one, idempotent, costing the charge", r1, r2)
	}
	if _, err := l.Reverse(ctx, r1.ID, "reverse the reversal"); !errors.Is(err, ledger.ErrInvalid) {
		t.Fatalf("reversing a reversal: %v, want ErrInvalid", err)
	}
	b, err := l.Bill(ctx, "acme", time.Time{}, time.Time{})
	if err != nil || b.NetMicros != 0 || b.GrossMicros != c.CostMicros || b.ReversedMicros != c.CostMicros {
		t.Fatalf("bill %+v, %v: want gross = reversed, net 0", b, err)
	}
}

// TestConcurrentCharges: goroutines on several connections (separate Ledgers, as separate
// workers would be) charge one tenant at once: every charge lands once, on one linear chain.
func TestConcurrentCharges(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	const conns, perConn, charges = 4, 4, 10
	var wg sync.WaitGroup
	errs := make(chan error, conns*perConn)
	for c := range conns {
		_, js := srv.Conn(t)
		l := ledger.New(js, testPrices, "USD")
		for g := range perConn {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range charges {
					key := fmt.Sprintf("c%dg%di%d", c, g, i)
					if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: key, JobID: j1, Epoch: 1, Model: "gpt-4o-mini",
						InputTokens: 100 + i, OutputTokens: 10}); err != nil {
						errs <- err
						return
					}
					// Every goroutine also re-charges one intent all the others charge too.
					if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: "shared", JobID: j1, Epoch: 1, Model: "gpt-4o-mini",
						InputTokens: 7}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	es, err := ledger.New(srv.JS, testPrices, "USD").Entries(ctx, "acme", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if want := conns*perConn*charges + 1; len(es) != want {
		t.Fatalf("%d entries, want %d", len(es), want)
	}
	if err := ledger.Verify(es); err != nil {
		t.Fatal(err)
	}
}

// TestEntriesAndBillPeriods: time bounds are [from, to); a reversal counts when it happened.
func TestEntriesAndBillPeriods(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	now := time.Date(2026, 1, 31, 23, 59, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	l := ledger.New(srv.JS, testPrices, "USD", ledger.WithClock(clock))
	jan, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	set(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC))
	if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k2, JobID: j2, Epoch: 1, Model: "claude-sonnet", InputTokens: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "globex", KeyHash: k3, JobID: j3, Epoch: 1, Model: "claude-sonnet", InputTokens: 1_000_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reverse(ctx, jan.ID, "refund"); err != nil {
		t.Fatal(err)
	}
	janStart, febStart, marStart := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name                 string
		tenant               string
		from, to             time.Time
		entries              int
		gross, reversed, net int64
	}{
		{"january", "acme", janStart, febStart, 1, 150_000, 0, 150_000},
		{"february", "acme", febStart, marStart, 2, 3_000_000, 150_000, 2_850_000},
		{"all time", "acme", time.Time{}, time.Time{}, 3, 3_150_000, 150_000, 3_000_000},
		{"every tenant", "", febStart, marStart, 3, 6_000_000, 150_000, 5_850_000},
		{"other tenant", "globex", time.Time{}, time.Time{}, 1, 3_000_000, 0, 3_000_000},
		{"unknown tenant", "nobody", time.Time{}, time.Time{}, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es, err := l.Entries(ctx, tt.tenant, tt.from, tt.to)
			if err != nil || len(es) != tt.entries {
				t.Fatalf("Entries: %d, %v; want %d", len(es), err, tt.entries)
			}
			b, err := l.Bill(ctx, tt.tenant, tt.from, tt.to)
			if err != nil {
				t.Fatal(err)
			}
			if b.GrossMicros != tt.gross || b.ReversedMicros != tt.reversed || b.NetMicros != tt.net || b.Currency != "USD" {
				t.Fatalf("bill %+v: want gross %d reversed %d net %d", b, tt.gross, tt.reversed, tt.net)
			}
		})
	}
}

func TestScansLeaveNoConsumers(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	buildGolden(t, srv.JS)
	l := ledger.New(srv.JS, testPrices, "USD")
	for _, tenant := range []string{"", "acme", "nobody"} {
		if _, err := l.Bill(ctx, tenant, time.Time{}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := srv.JS.Stream(ctx, ledger.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on LEDGER (%v), want 0", info.State.Consumers, err)
	}
}

func TestFormatMicros(t *testing.T) {
	for in, want := range map[int64]string{0: "0.000000", 1: "0.000001", 1_500_000: "1.500000", -2_000_001: "-2.000001"} {
		if got := ledger.FormatMicros(in); got != want {
			t.Errorf("FormatMicros(%d) = %s, want %s", in, got, want)
		}
	}
}

// TestDedupHorizon: with a horizon, a process's first append to a tenant reads only recent
// entries; a charge within it is still written once, and a reversal or continuation of an
// older charge still finds it.
func TestDedupHorizon(t *testing.T) {
	tests := []struct {
		name    string
		horizon time.Duration
	}{
		{"everything recent", time.Hour},
		{"everything older than the horizon", time.Nanosecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := start(t)
			ctx := ctxT(t)
			fresh := func() *ledger.Ledger {
				_, js := srv.Conn(t)
				return ledger.New(js, testPrices, "USD", ledger.WithDedupHorizon(tt.horizon))
			}
			in := ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 100}
			c, err := fresh().Charge(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 { // unrelated entries after it
				if _, err := fresh().Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k2, JobID: j2, Epoch: 1, Attempt: i, Model: "gpt-4o-mini", InputTokens: 1}); err != nil {
					t.Fatal(err)
				}
			}
			// Within the horizon the id index finds it; beyond, the stream's Nats-Msg-Id window
			// (DuplicateWindow) still does.
			again, err := fresh().Charge(ctx, in)
			if err != nil || again.Seq != c.Seq {
				t.Fatalf("charge again: %+v, %v; want the first (seq %d)", again, err, c.Seq)
			}
			if _, err := fresh().Continuation(ctx, c.ID, ledger.ChargeInput{Tenant: "acme", Attempt: 2, InputTokens: 5}); err != nil {
				t.Fatalf("continuation of an older charge: %v", err)
			}
			r1, err := fresh().Reverse(ctx, c.ID, "refund")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fresh().Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k3, JobID: j3, Epoch: 1, Model: "gpt-4o-mini", InputTokens: 1}); err != nil {
				t.Fatal(err)
			}
			r2, err := fresh().Reverse(ctx, c.ID, "refund again")
			if err != nil || r2.Seq != r1.Seq {
				t.Fatalf("second reversal %+v, %v; want the first (seq %d)", r2, err, r1.Seq)
			}
			es, err := fresh().Entries(ctx, "", time.Time{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if err := ledger.Verify(es); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUnpricedWarnedOncePerModel: charging an unpriced model warns once per model per process,
// not once per request.
func TestUnpricedWarnedOncePerModel(t *testing.T) {
	srv := start(t)
	ctx := ctxT(t)
	var logs bytes.Buffer
	l := ledger.New(srv.JS, testPrices, "USD", ledger.WithLogger(zerolog.New(&logs).Level(zerolog.WarnLevel)))
	for i, model := range []string{"unpriced-a", "unpriced-a", "unpriced-b", "unpriced-a", "gpt-4o-mini"} {
		job := fmt.Sprintf("01J00000000000000000000%03d", i)
		if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: job, Epoch: 1, Attempt: 1, Model: model, InputTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "model has no price"); n != 2 {
		t.Fatalf("%d unpriced-model warnings for 2 unpriced models, want 2:\n%s", n, logs.String())
	}
}
