package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestTakeoverLogLineHasOneEpoch: the line a worker logs when it takes an execution over names
// the new epoch once (a JSON object with a key twice is read differently by every log pipeline).
// The takeover is counted too: one redelivery, one takeover, one attempt, one execution.
func TestTakeoverLogLineHasOneEpoch(t *testing.T) {
	r := resources(t)
	ctx := context.Background()
	const key = "takeover-log"
	rec, rev := r.claim(t, key, `{"model":"oncegate-mock","messages":[{"role":"user","content":"takeover log"}]}`, false)
	rec.LeaseUntil = time.Now().Add(-time.Second) // its worker vanished
	rev, err := r.store.Update(ctx, key, rec, rev)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
		t.Fatal(err)
	}
	// The vanished worker's delivery: fetched and given back, so the pool sees a redelivery.
	cons, err := workers.EnsureConsumer(ctx, r.srv.JS, 0, 2*time.Second, 16)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	if n != 1 {
		t.Fatalf("fetched %d job messages, want 1", n)
	}

	mock, err := backend.New(config.Backend{Name: "mock", Type: config.TypeMock, Models: []string{"oncegate-mock"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{Tokens: 4}, Breaker: config.Breaker{MinRequests: 1000}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs testkit.SyncBuffer
	m := telemetry.New(telemetry.Labels{Backends: []string{"mock"}})
	run(t, workers.New(r.srv.JS, r.store, workers.Options{ID: "w2", Concurrency: 2, Lease: 2 * time.Second,
		RenewEvery: 200 * time.Millisecond, Backends: map[string]workers.Backend{"mock": mock},
		Log: zerolog.New(&logs), SweepEvery: -1, Metrics: m}))
	got := r.waitFinal(t, key)
	if got.State != kv.Completed || got.Epoch != 2 {
		t.Fatalf("state %s epoch %d, want COMPLETED at epoch 2", got.State, got.Epoch)
	}

	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "took over execution") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no takeover line in the log:\n%s", logs.String())
	}
	if c := strings.Count(line, `"epoch":`); c != 1 {
		t.Errorf(`takeover line has "epoch" %d times, want once: %s`, c, line)
	}
	var fields map[string]any
	if err := json.Unmarshal([]byte(line), &fields); err != nil {
		t.Fatalf("takeover line is not JSON: %v: %s", err, line)
	}
	if fields["epoch"] != float64(2) {
		t.Errorf("epoch %v, want the new epoch 2: %s", fields["epoch"], line)
	}
	// The execution is counted once its outcome is stored: it may be read before that.
	mock1 := func(result string) map[string]string { return map[string]string{"backend": "mock", "result": result} }
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, c := range []struct {
			name   string
			labels map[string]string
		}{
			{"oncegate_jobs_redelivered_total", nil}, {"oncegate_takeovers_total", nil},
			{"oncegate_backend_attempts_total", mock1("ok")}, {"oncegate_backend_executions_total", mock1("completed")},
		} {
			if got := m.Value(c.name, c.labels); got != 1 {
				return fmt.Errorf("%s%v = %v, want 1", c.name, c.labels, got)
			}
		}
		return nil
	})
}
