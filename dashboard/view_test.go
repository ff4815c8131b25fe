package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// Two API nodes and a worker: the execution of job J1 (tenant a) runs on w1 and has 3 copies
// joined on api1 and 2 on api2; job J2 (tenant b) runs on w1 with none.
func cluster() []Snapshot {
	return []Snapshot{
		{Node: "api1", Roles: "api", At: t0,
			Counts: []Counts{{Tenant: "a", Outcomes: [NumOutcomes]int64{1, 3, 1, 0, 1}, AddedNanos: 4e6, AddedCount: 2},
				{Tenant: "b", Outcomes: [NumOutcomes]int64{1, 0, 0, 1, 0}, Reversals: 1}},
			Money: []Money{{Tenant: "a", Model: "m", SpendMicros: 100, Joined: 3, Replayed: 1, SavedMicros: 400},
				{Tenant: "b", Model: "m", SpendMicros: 50}},
			Follows: []Follow{{JobID: "J1", Tenant: "a", Joined: 3, Copies: 4}, {JobID: "J2", Tenant: "b", Copies: 1}}, FollowsTotal: 2},
		{Node: "api2", Roles: "api", At: t0.Add(-time.Second),
			Counts:  []Counts{{Tenant: "a", Outcomes: [NumOutcomes]int64{0, 2, 0, 0, 0}}},
			Money:   []Money{{Tenant: "a", Model: "m", Joined: 2, SavedMicros: 200}},
			Follows: []Follow{{JobID: "J1", Tenant: "a", Joined: 2, Copies: 2}}, FollowsTotal: 1},
		{Node: "w1", Roles: "worker", At: t0,
			Executions:      []Execution{{JobID: "J2", Tenant: "b", Started: t0.Add(-time.Second)}, {JobID: "J1", Tenant: "a", Started: t0.Add(-2 * time.Second)}},
			ExecutionsTotal: 2,
			Backends:        []Backend{{Name: "x", Breaker: "closed", Requests: 10, Failures: 1, LatencyMillis: 5}},
			Events:          []Event{{At: t0.Add(-time.Minute), Kind: EventFailed, JobID: "J0", Tenant: "b", Reason: "502"}}},
		{Node: "w2", Roles: "worker", At: t0,
			Backends: []Backend{{Name: "x", Breaker: "open", Requests: 4, Failures: 4, LatencyMillis: 9}},
			Events:   []Event{{At: t0, Kind: EventTakeover, JobID: "J1", Tenant: "a", Reason: "lease"}}},
	}
}

func TestAggregate(t *testing.T) {
	cases := []struct {
		name  string
		snaps []Snapshot
		scope Scope
		now   time.Time
		check func(t *testing.T, v View)
	}{
		{"followers are summed over API nodes, creator not counted", cluster(), Scope{All: true}, t0, func(t *testing.T, v View) {
			if len(v.Executions) != 2 || v.Executions[0].JobID != "J1" || v.Executions[0].Followers != 5 || v.Executions[1].Followers != 0 {
				t.Errorf("executions %+v, want J1 (oldest) with 5 followers, then J2 with 0", v.Executions)
			}
		}},
		{"outcomes, latency and money are summed", cluster(), Scope{All: true}, t0, func(t *testing.T, v View) {
			if v.Outcomes != [NumOutcomes]int64{2, 5, 1, 1, 1} || v.AddedNanos != 4e6 || v.AddedCount != 2 {
				t.Errorf("outcomes %v added %d/%d", v.Outcomes, v.AddedNanos, v.AddedCount)
			}
			if v.Avoided != 6 || v.SavedMicros != 600 || v.SpendMicros != 150 || v.Reversals != 1 {
				t.Errorf("avoided %d saved %d spend %d reversals %d, want 6, 600, 150, 1", v.Avoided, v.SavedMicros, v.SpendMicros, v.Reversals)
			}
			if want := 6.0 / 9; v.HitRatio != want {
				t.Errorf("hit ratio %v, want %v", v.HitRatio, want)
			}
			if len(v.Money) != 2 || v.Money[0] != (Money{Tenant: "a", Model: "m", SpendMicros: 100, Joined: 5, Replayed: 1, SavedMicros: 600}) {
				t.Errorf("money %+v", v.Money)
			}
		}},
		{"backends merge to the worst breaker, summed windows, slowest median", cluster(), Scope{All: true}, t0, func(t *testing.T, v View) {
			if len(v.Backends) != 1 || v.Backends[0] != (Backend{Name: "x", Breaker: "open", Requests: 14, Failures: 5, LatencyMillis: 9}) {
				t.Errorf("backends %+v", v.Backends)
			}
		}},
		{"events newest first", cluster(), Scope{All: true}, t0, func(t *testing.T, v View) {
			if len(v.Events) != 2 || v.Events[0].Kind != EventTakeover || v.Events[1].Kind != EventFailed {
				t.Errorf("events %+v", v.Events)
			}
			if len(v.Nodes) != 4 || v.Nodes[0].Node != "api1" {
				t.Errorf("nodes %+v", v.Nodes)
			}
		}},
		{"a tenant sees its rows only", cluster(), Scope{Tenant: "a"}, t0, func(t *testing.T, v View) {
			if len(v.Executions) != 1 || v.Executions[0].JobID != "J1" || v.Executions[0].Followers != 5 || v.ExecutionsTotal != 1 {
				t.Errorf("executions %+v (total %d)", v.Executions, v.ExecutionsTotal)
			}
			if v.Outcomes != [NumOutcomes]int64{1, 5, 1, 0, 1} || v.Reversals != 0 || v.SpendMicros != 100 || len(v.Money) != 1 {
				t.Errorf("outcomes %v reversals %d spend %d money %+v", v.Outcomes, v.Reversals, v.SpendMicros, v.Money)
			}
			if len(v.Events) != 1 || v.Events[0].Tenant != "a" || v.Nodes != nil || v.Tenant != "a" {
				t.Errorf("events %+v nodes %+v tenant %q", v.Events, v.Nodes, v.Tenant)
			}
		}},
		{"a stale snapshot is left out", cluster(), Scope{All: true}, t0.Add(SnapshotTTL - 500*time.Millisecond), func(t *testing.T, v View) {
			// api2's is a second older than the others: only it is past the TTL.
			if len(v.Nodes) != 3 || v.Executions[0].Followers != 3 {
				t.Errorf("nodes %+v, J1 followers %d; want api2 left out (3 followers)", v.Nodes, v.Executions[0].Followers)
			}
		}},
		{"rows left out of a snapshot are said", []Snapshot{{Node: "w", At: t0, Executions: []Execution{{JobID: "J", Tenant: "a"}}, ExecutionsTotal: 250}},
			Scope{All: true}, t0, func(t *testing.T, v View) {
				if !v.Truncated || v.ExecutionsTotal != 250 || len(v.Executions) != 1 {
					t.Errorf("truncated %v total %d rows %d", v.Truncated, v.ExecutionsTotal, len(v.Executions))
				}
			}},
		{"nothing at all", nil, Scope{All: true}, t0, func(t *testing.T, v View) {
			b, _ := json.Marshal(v)
			var back map[string]any
			_ = json.Unmarshal(b, &back)
			for _, k := range []string{"executions", "backends", "money", "events"} {
				if _, ok := back[k].([]any); !ok {
					t.Errorf("%s is %v, want an empty list (the page iterates it)", k, back[k])
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.check(t, Aggregate(c.snaps, c.scope, c.now)) })
	}
}

func TestTally(t *testing.T) {
	tl := NewTally([]string{"a"})
	tl.Request("a", telemetry.Joined)
	tl.Request("a", telemetry.Joined)
	tl.Request("a", telemetry.InUse)    // not a dashboard outcome
	tl.Request("zed", telemetry.Joined) // not a configured tenant
	tl.Added("a", 3*time.Millisecond)
	tl.Request(telemetry.Anonymous, telemetry.Created)
	got := tl.counts(map[string]int64{"a": 2})
	want := []Counts{{Tenant: telemetry.Anonymous, Outcomes: [NumOutcomes]int64{1}},
		{Tenant: "a", Outcomes: [NumOutcomes]int64{0, 2}, AddedNanos: 3e6, AddedCount: 1, Reversals: 2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	var nilTally *Tally
	nilTally.Request("a", telemetry.Created) // a nil tally counts nothing, and does not panic
}

// TestSpendToday: the spend a snapshot shows is since the UTC day began.
func TestSpendToday(t *testing.T) {
	p := NewPublisher(nil, Sources{}, zerolog.Nop())
	row := func(spend int64) []telemetry.MoneyRow {
		return []telemetry.MoneyRow{{Tenant: "a", Model: "m", SpendMicros: spend}}
	}
	if m := p.money(t0, row(100)); m[0].SpendMicros != 100 {
		t.Errorf("first day: %d, want 100", m[0].SpendMicros)
	}
	if m := p.money(t0.Add(24*time.Hour), row(130)); m[0].SpendMicros != 0 {
		t.Errorf("the next day's first snapshot: %d, want 0", m[0].SpendMicros)
	}
	if m := p.money(t0.Add(25*time.Hour), row(175)); m[0].SpendMicros != 45 {
		t.Errorf("later that day: %d, want 45", m[0].SpendMicros)
	}
}

// TestHubFeedsEachScope runs two publishers and a hub on a real JetStream: a subscriber of
// each scope gets views built from both snapshots, filtered to its scope, and Close ends the
// feeds.
func TestHubFeedsEachScope(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	_, js := srv.Conn(t)
	open := func(ctx context.Context) (jetstream.KeyValue, error) { return Open(ctx, js, 1) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 3)
	run := func(f func(context.Context)) {
		go func() {
			defer func() { done <- struct{}{} }()
			f(ctx)
		}()
	}
	exec := func(job, tenant string) func(int) ([]Execution, int) {
		return func(int) ([]Execution, int) { return []Execution{{JobID: job, Tenant: tenant, Started: time.Now()}}, 1 }
	}
	run(NewPublisher(open, Sources{Node: "n1", Roles: "worker", Executions: exec("J1", "a")}, zerolog.Nop()).Run)
	run(NewPublisher(open, Sources{Node: "n2", Roles: "worker", Executions: exec("J2", "b")}, zerolog.Nop()).Run)
	hub := NewHub(open, zerolog.Nop())
	run(hub.Run)

	all, _ := hub.Subscribe(Scope{All: true})
	onlyA, _ := hub.Subscribe(Scope{Tenant: "a"})
	jobs := func(sub *Sub, want int) []string {
		var ids []string
		testkit.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
			var v View
			if err := json.Unmarshal(testkit.RequireChanRead(t, sub.C(), 5*time.Second), &v); err != nil {
				return err
			}
			ids = ids[:0]
			for _, e := range v.Executions {
				ids = append(ids, e.JobID)
			}
			if len(ids) != want {
				return fmt.Errorf("jobs %v, want %d", ids, want)
			}
			return nil
		})
		return ids
	}
	if got := jobs(all, 2); fmt.Sprint(got) != "[J1 J2]" && fmt.Sprint(got) != "[J2 J1]" {
		t.Errorf("all: %v", got)
	}
	if got := jobs(onlyA, 1); got[0] != "J1" {
		t.Errorf("tenant a: %v", got)
	}
	hub.Close()
	for range 10 { // closed: drained and ended
		if _, ok := <-all.C(); !ok {
			break
		}
	}
	if _, ok := hub.Subscribe(Scope{All: true}); ok {
		t.Error("a closed hub accepted a subscriber")
	}
	all.Close() // idempotent after the hub closed
	cancel()
	for range 3 {
		<-done
	}
}
