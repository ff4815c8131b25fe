package ledger_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testPrices are micro-units per million tokens (1 unit = 1,000,000 micros).
var testPrices = ledger.Prices{
	"gpt-4o-mini":   {InputPerMillion: 150_000, OutputPerMillion: 600_000},
	"claude-sonnet": {InputPerMillion: 3_000_000, OutputPerMillion: 15_000_000},
	"oncegate-mock": {InputPerMillion: 1_000_000, OutputPerMillion: 2_000_000},
}

// stepClock is a deterministic clock: every call returns one second more.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func newStepClock(start time.Time) *stepClock { return &stepClock{t: start.Add(-time.Second)} }

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

// start starts a synced embedded server with the LEDGER stream.
func start(t testing.TB) *testkit.JetStream {
	t.Helper()
	srv := testkit.RunJetStream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ledger.EnsureStream(ctx, srv.JS); err != nil {
		t.Fatal(err)
	}
	return srv
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func streamMsgs(t testing.TB, js jetstream.JetStream) uint64 {
	t.Helper()
	return msgsOf(t, js, ledger.StreamName)
}

// msgsOf is how many messages the stream name holds.
func msgsOf(t testing.TB, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	st, err := js.Stream(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Intent key hashes and job ids used by the tests and the golden files.
const (
	k1 = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	k2 = "1a2b3c4d5e6f708192a3b4c5d6e7f801"
	k3 = "2b3c4d5e6f708192a3b4c5d6e7f80112"
	k4 = "3c4d5e6f708192a3b4c5d6e7f8011223"
	k5 = "4d5e6f708192a3b4c5d6e7f801122334"
	j1 = "01JNV6Q5M8X3Z9A4B7C2D1E0F1"
	j2 = "01JNV6Q5M8X3Z9A4B7C2D1E0F2"
	j3 = "01JNV6Q5M8X3Z9A4B7C2D1E0F3"
	j4 = "01JNV6Q5M8X3Z9A4B7C2D1E0F4"
	j5 = "01JNV6Q5M8X3Z9A4B7C2D1E0F5"
)

// goldenStart is the clock of the golden scenario.
var goldenStart = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

// buildGolden writes the golden scenario through the real ledger: five intents over two
// tenants, one of them executed twice (a zombie epoch 1 with a continuation, and the completed
// epoch 2), then one Reconcile. It returns every entry.
func buildGolden(t testing.TB, js jetstream.JetStream) []ledger.Entry {
	t.Helper()
	ctx := ctxT(t)
	l := ledger.New(js, testPrices, "USD", ledger.WithClock(newStepClock(goldenStart).Now))
	charge := func(c ledger.ChargeInput) ledger.Entry {
		t.Helper()
		e, err := l.Charge(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	charge(ledger.ChargeInput{Tenant: "acme", KeyHash: k1, JobID: j1, Epoch: 1, Attempt: 1, Model: "gpt-4o-mini", Backend: "openai",
		InputTokens: 1200, OutputTokens: 350, Completed: true, Fence: 2})
	charge(ledger.ChargeInput{Tenant: "globex", KeyHash: k2, JobID: j2, Epoch: 1, Attempt: 1, Model: "claude-sonnet", Backend: "anthropic",
		InputTokens: 5000, OutputTokens: 800, Completed: true, Fence: 4})
	zombie := charge(ledger.ChargeInput{Tenant: "acme", KeyHash: k3, JobID: j3, Epoch: 1, Attempt: 1, Model: "gpt-4o-mini", Backend: "openai",
		InputTokens: 900, OutputTokens: 400, Fence: 6})
	charge(ledger.ChargeInput{Tenant: "acme", KeyHash: k3, JobID: j3, Epoch: 2, Attempt: 1, Model: "gpt-4o-mini", Backend: "openai",
		InputTokens: 900, OutputTokens: 410, Completed: true, Fence: 9})
	if _, err := l.Continuation(ctx, zombie.ID, ledger.ChargeInput{Attempt: 2, Backend: "openai", InputTokens: 950, OutputTokens: 120, Fence: 6}); err != nil {
		t.Fatal(err)
	}
	charge(ledger.ChargeInput{Tenant: "acme", KeyHash: k4, JobID: j4, Epoch: 1, Attempt: 1, Model: "oncegate-mock", Backend: "mock",
		InputTokens: 40, OutputTokens: 16, Estimated: true, Completed: true, Fence: 11})
	charge(ledger.ChargeInput{Tenant: "globex", KeyHash: k5, JobID: j5, Epoch: 1, Attempt: 1, Model: "claude-sonnet", Backend: "anthropic",
		InputTokens: 100, OutputTokens: 50, Completed: true, Fence: 13})
	if _, err := l.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return es
}
