package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

// startTally starts a synced embedded server with LEDGER and OG_TALLY.
func startTally(t *testing.T) *testkit.JetStream {
	t.Helper()
	srv := start(t)
	if err := ledger.EnsureTally(ctxT(t), srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	return srv
}

func tallyMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	return msgsOf(t, js, ledger.TallyStreamName)
}

// counts is a tenant's reports summed by model.
func counts(t *testing.T, l *ledger.Ledger, tenant string) map[string]ledger.TallyCounts {
	t.Helper()
	rs, err := l.Tallies(ctxT(t), tenant, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ledger.TallyCounts{}
	for _, r := range rs {
		for _, c := range r.Models {
			s := out[c.Model]
			s.Model = c.Model
			s.Joined += c.Joined
			s.Replayed += c.Replayed
			s.SavedMicros += c.SavedMicros
			out[c.Model] = s
		}
	}
	return out
}

func TestTallyFlush(t *testing.T) {
	srv := startTally(t)
	clock := newStepClock(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	tally := ledger.NewTally(srv.JS, ledger.TallyOptions{Node: "n1", Every: time.Hour, Now: clock.Now})
	l := ledger.New(srv.JS, testPrices, "")
	tally.Avoided("acme", "gpt-4o-mini", true, 10)
	tally.Avoided("acme", "gpt-4o-mini", true, 10)
	tally.Avoided("acme", "gpt-4o-mini", false, 10)
	tally.Avoided("acme", "claude-sonnet", false, 7)
	tally.Avoided("globex", "gpt-4o-mini", false, 3)
	if err := tally.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := tallyMsgs(t, srv.JS); n != 2 {
		t.Fatalf("%d messages, want one per tenant (2)", n)
	}
	want := map[string]ledger.TallyCounts{
		"gpt-4o-mini":   {Model: "gpt-4o-mini", Joined: 2, Replayed: 1, SavedMicros: 30},
		"claude-sonnet": {Model: "claude-sonnet", Replayed: 1, SavedMicros: 7},
	}
	if got := counts(t, l, "acme"); !reflect.DeepEqual(got, want) {
		t.Errorf("acme: %+v, want %+v", got, want)
	}
	rs, err := l.Tallies(ctxT(t), "globex", time.Time{}, time.Time{})
	if err != nil || len(rs) != 1 {
		t.Fatalf("globex: %+v, %v", rs, err)
	}
	if r := rs[0]; r.Tenant != "globex" || !r.From.Before(r.To) || r.Models[0].Replayed != 1 {
		t.Errorf("globex report %+v", r)
	}

	// Nothing counted: nothing published. The next report starts where the last ended.
	if err := tally.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := tallyMsgs(t, srv.JS); n != 2 {
		t.Errorf("an empty flush published: %d messages", n)
	}
	tally.Avoided("globex", "gpt-4o-mini", true, 0)
	if err := tally.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	rs2, err := l.Tallies(ctxT(t), "globex", time.Time{}, time.Time{})
	if err != nil || len(rs2) != 2 || !rs2[1].From.Equal(rs[0].To) || rs2[1].ID == rs[0].ID {
		t.Fatalf("globex's second report %+v (%v): want it to start at the first's end, with its own id", rs2, err)
	}

	// Every tenant; and the period filter is on the interval's end.
	all, err := l.Tallies(ctxT(t), "", time.Time{}, time.Time{})
	if err != nil || len(all) != 3 {
		t.Fatalf("every tenant: %d reports (%v), want 3", len(all), err)
	}
	if rs, _ := l.Tallies(ctxT(t), "", all[2].To, time.Time{}); len(rs) != 1 {
		t.Errorf("from the last report's end: %d reports, want 1", len(rs))
	}
	if rs, _ := l.Tallies(ctxT(t), "", time.Time{}, all[2].To); len(rs) != 2 {
		t.Errorf("up to the last report's end (exclusive): %d reports, want 2", len(rs))
	}

	// Bill reads the tally next to the entries.
	b, err := l.Bill(ctxT(t), "acme", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Joined != 2 || b.Replayed != 2 || b.ExecutionsAvoided != 4 || b.SavedMicros != 37 || b.SuccessfulCalls != 4 || b.DuplicateRatio != 1 {
		t.Errorf("acme's bill %+v", b.Calls)
	}
}

// TestTallyFailedFlushKeepsCounts: a flush that cannot publish (no OG_TALLY yet) keeps its
// report, and the next flush stores it unchanged, then the counts made meanwhile.
func TestTallyFailedFlushKeepsCounts(t *testing.T) {
	srv := start(t) // LEDGER only: publishing to og.tally.* has no stream to answer
	tally := ledger.NewTally(srv.JS, ledger.TallyOptions{Node: "n1", Every: time.Hour})
	l := ledger.New(srv.JS, testPrices, "")
	tally.Avoided("acme", "gpt-4o-mini", true, 10)
	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
	defer cancel()
	if err := tally.Flush(ctx); err == nil {
		t.Fatal("a flush without OG_TALLY succeeded")
	}
	tally.Avoided("acme", "gpt-4o-mini", false, 5)
	if err := tally.Flush(ctx); err == nil {
		t.Fatal("a second flush without OG_TALLY succeeded")
	}
	if err := ledger.EnsureTally(ctxT(t), srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	tally.Avoided("acme", "gpt-4o-mini", false, 5)
	if err := tally.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	rs, err := l.Tallies(ctxT(t), "acme", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 {
		t.Fatalf("%d reports, want the kept one and the next: %+v", len(rs), rs)
	}
	if c := rs[0].Models[0]; c.Joined != 1 || c.Replayed != 0 || c.SavedMicros != 10 {
		t.Errorf("the kept report changed: %+v", c)
	}
	if c := rs[1].Models[0]; c.Joined != 0 || c.Replayed != 2 || c.SavedMicros != 10 || !rs[1].From.Equal(rs[0].To) {
		t.Errorf("the next report %+v", rs[1])
	}
}

// TestTallyResentReportCountsOnce: a report published again under its id is dropped by the
// stream's duplicate window; past the window (no id), the reader still counts it once.
func TestTallyResentReportCountsOnce(t *testing.T) {
	srv := startTally(t)
	tally := ledger.NewTally(srv.JS, ledger.TallyOptions{Node: "n1", Every: time.Hour})
	l := ledger.New(srv.JS, testPrices, "")
	tally.Avoided("acme", "gpt-4o-mini", true, 10)
	if err := tally.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	st, err := srv.JS.Stream(ctxT(t), ledger.TallyStreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	var r ledger.TallyReport
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != r.ID || id == "" {
		t.Fatalf("Nats-Msg-Id %q, report id %q", id, r.ID)
	}
	ack, err := srv.JS.PublishMsg(ctxT(t), &nats.Msg{Subject: m.Subject, Data: m.Data}, jetstream.WithMsgID(r.ID))
	if err != nil || !ack.Duplicate {
		t.Fatalf("re-sent with its id: ack %+v, %v; want a duplicate", ack, err)
	}
	if _, err := srv.JS.Publish(ctxT(t), m.Subject, m.Data); err != nil { // as if past the window
		t.Fatal(err)
	}
	if n := tallyMsgs(t, srv.JS); n != 2 {
		t.Fatalf("%d messages, want 2", n)
	}
	if got := counts(t, l, "acme")["gpt-4o-mini"]; got.Joined != 1 || got.SavedMicros != 10 {
		t.Errorf("counted %+v, want the report once", got)
	}
}

// TestTallyRunFlushesOnStop: Run's end flushes what was counted; its goroutine is gone
// (goleak, in TestMain).
func TestTallyRunFlushesOnStop(t *testing.T) {
	srv := startTally(t)
	tally := ledger.NewTally(srv.JS, ledger.TallyOptions{Node: "n1", Every: time.Hour})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- tally.Run(ctx) }()
	tally.Avoided("acme", "gpt-4o-mini", false, 4)
	cancel()
	if err := testkit.RequireChanRead(t, done, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := counts(t, ledger.New(srv.JS, testPrices, ""), "acme")["gpt-4o-mini"]; got.Replayed != 1 || got.SavedMicros != 4 {
		t.Errorf("after Run stopped: %+v, want the replay", got)
	}
}

// TestTallyRunFlushesEveryInterval: Run publishes without being stopped.
func TestTallyRunFlushesEveryInterval(t *testing.T) {
	srv := startTally(t)
	tally := ledger.NewTally(srv.JS, ledger.TallyOptions{Node: "n1", Every: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- tally.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	tally.Avoided("acme", "gpt-4o-mini", true, 1)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if tallyMsgs(t, srv.JS) == 0 {
			return errors.New("no report yet")
		}
		return nil
	})
}

// TestTallyBoundedModels: past MaxKeys counters, new models count under "other".
func TestTallyBoundedModels(t *testing.T) {
	srv := startTally(t)
	tally := ledger.NewTally(srv.JS, ledger.TallyOptions{Node: "n1", Every: time.Hour, MaxKeys: 2})
	for _, m := range []string{"a", "b", "c", "d", "a"} {
		tally.Avoided("acme", m, false, 1)
	}
	if err := tally.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	got := counts(t, ledger.New(srv.JS, testPrices, ""), "acme")
	want := map[string]ledger.TallyCounts{
		"a":                    {Model: "a", Replayed: 2, SavedMicros: 2},
		"b":                    {Model: "b", Replayed: 1, SavedMicros: 1},
		ledger.TallyOtherModel: {Model: ledger.TallyOtherModel, Replayed: 2, SavedMicros: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%+v, want %+v", got, want)
	}
}

func TestTallyNil(t *testing.T) {
	var tally *ledger.Tally
	tally.Avoided("acme", "m", true, 1) // no panic
}

func TestEnsureTallyIdempotent(t *testing.T) {
	srv := startTally(t)
	if err := ledger.EnsureTally(ctxT(t), srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	st, err := srv.JS.Stream(ctxT(t), ledger.TallyStreamName)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.Storage != jetstream.FileStorage || !c.DenyDelete || !c.DenyPurge {
		t.Errorf("config %+v", c)
	}
	if ledger.TallySubject("acme") == ledger.TallySubject("globex") || ledger.TallySubject("acme") == "og.tally.acme" {
		t.Errorf("tally subjects must be distinct hashes: %s", ledger.TallySubject("acme"))
	}
}

// TestTallyAvoidedAllocs: counting a (tenant, model) already counted allocates nothing.
func TestTallyAvoidedAllocs(t *testing.T) {
	tally := ledger.NewTally(nil, ledger.TallyOptions{Node: "n1"})
	tenant, model := "acme", "gpt-4o-mini"
	tally.Avoided(tenant, model, true, 1)
	if n := testing.AllocsPerRun(1000, func() { tally.Avoided(tenant, model, false, 3) }); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}
