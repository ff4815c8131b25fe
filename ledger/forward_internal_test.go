package ledger

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/testkit"
)

// forwardingNodes starts a three-node cluster with a replicated LEDGER and one Ledger per
// server, each told by its own server whether it leads the stream, and runs every Ledger's
// ServeAppends (stopped and waited for at cleanup) when serve is set.
func forwardingNodes(ctx context.Context, t *testing.T, serve bool) (*testkit.Cluster, []*Ledger) {
	t.Helper()
	cl := testkit.RunCluster(t, 3)
	m := telemetry.New(telemetry.Labels{}) // the nodes' counters, summed
	ls := make([]*Ledger, cl.Size())
	for i := range ls {
		_, js := cl.ConnectTo(t, i)
		if i == 0 {
			if err := EnsureReplicated(ctx, js, 3); err != nil {
				t.Fatal(err)
			}
		}
		srv := cl.Server(i)
		ls[i] = New(js, nil, "USD", WithSecret(forwardSecret), WithMetrics(m), WithLeaderCheck(func(stream string) bool {
			return srv.JetStreamIsStreamLeader(jetstreamAccount, stream)
		}))
	}
	if !serve {
		return cl, ls
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() {
			if err := l.ServeAppends(sctx); err != nil {
				t.Errorf("serve appends: %v", err)
			}
		})
	}
	t.Cleanup(func() { stop(); wg.Wait() })
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, l := range ls {
			if l.serving.Load() {
				return nil
			}
		}
		return errors.New("no node serves the ledger's appends yet")
	})
	return cl, ls
}

// jetstreamAccount is the account the test cluster keeps its streams in (none configured).
const jetstreamAccount = "$G"

// forwardSecret keys the test ledgers' chains, and so signs their forwarded appends.
var forwardSecret = []byte("0123456789abcdef0123456789abcdef-forward")

// forwardsCounted is oncegate_ledger_forwards_total of outcome, over the nodes of ls.
func forwardsCounted(ls []*Ledger, outcome string) float64 {
	return ls[0].metrics.Value("oncegate_ledger_forwards_total", map[string]string{"outcome": outcome})
}

func sumOf(ls []*Ledger, n func(*Ledger) int64) (s int64) {
	for _, l := range ls {
		s += n(l)
	}
	return s
}

// TestForwardedAppendsAreNeverRefused: three nodes charge one tenant at once. Every node that
// does not lead LEDGER hands its charges to the one that does, so no publish is refused for a
// stale head (without forwarding this test saw 3 refusals; each costs a re-read of the chain),
// and the chain holds each charge once, at the sequence its caller was told.
func TestForwardedAppendsAreNeverRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, ls := forwardingNodes(ctx, t, true)
	const n = 200
	got := chargeAll(ctx, t, ls, "acme", "k", n)
	checkChain(ctx, t, ls[0], "acme", n, got)
	if r := sumOf(ls, func(l *Ledger) int64 { return l.refused.Load() }); r != 0 {
		t.Errorf("%d publishes were refused for a stale head; want 0", r)
	}
	// chargeAll spreads the charges evenly: the two nodes that do not lead sent 2n/3 of them.
	if f := forwardsCounted(ls, "appended"); f < 2*n/3-1 {
		t.Errorf("%v charges were forwarded and appended there, want the non-leaders' %d", f, 2*n/3)
	}
}

// TestAppendsStayLocalWithoutAnAppender: with a leader check but nobody serving (a leader node
// that runs no workers), a forward gets "no responders" at once and the node appends itself.
func TestAppendsStayLocalWithoutAnAppender(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, ls := forwardingNodes(ctx, t, false)
	const n = 30
	got := chargeAll(ctx, t, ls, "acme", "k", n)
	checkChain(ctx, t, ls[0], "acme", n, got)
	// Every charge was sent, found nobody, and was appended by its own node.
	if got, appended := forwardsCounted(ls, "fallback"), forwardsCounted(ls, "appended"); got != n || appended != 0 {
		t.Errorf("ledger_forwards_total: fallback %v, appended %v; want %d, 0", got, appended, n)
	}
}

// TestUnansweredForwardStoredOnce: the appender stores the charge and dies before it answers.
// The sender, unanswered after its wait, appends the same charge itself and is given the
// stored entry: one entry in the chain, not two.
func TestUnansweredForwardStoredOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, ls := forwardingNodes(ctx, t, false)
	appender, sender := ls[0], ls[1]
	sender.forwardWait = 300 * time.Millisecond
	stored := make(chan Entry, 1)
	nc, _ := cl.ConnectTo(t, 0)
	sub, err := nc.Subscribe(appender.forwardSubject(), func(m *nats.Msg) {
		var req forwardRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("forward request: %v", err)
			return
		}
		out, _, err := appender.appendHere(ctx, req.E, nil, req.After)
		if err != nil {
			t.Errorf("appender: %v", err)
		}
		stored <- out // and no answer
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The subscription's interest must have reached every server, the sender's among them.
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if clusterHasInterest(cl, appender.forwardSubject()) {
			return nil
		}
		return fmt.Errorf("no interest in %s on every server yet", appender.forwardSubject())
	})
	got, err := sender.Charge(ctx, ChargeInput{Tenant: "acme", KeyHash: "k1", JobID: "j1", Epoch: 1, Attempt: 1, Model: "m",
		InputTokens: 10, OutputTokens: 5, Completed: true})
	if err != nil {
		t.Fatal(err)
	}
	var first Entry
	select {
	case first = <-stored:
	case <-ctx.Done():
		t.Fatal("the appender never received the forward")
	}
	if got.ID != first.ID || got.Seq != first.Seq || got.Hash != first.Hash {
		t.Errorf("the sender got %s at seq %d, the appender stored %s at seq %d", got.ID, got.Seq, first.ID, first.Seq)
	}
	if f := forwardsCounted(ls, "appended"); f != 0 {
		t.Errorf("%v forwards counted appended, want 0 (the forward was never answered)", f)
	}
	checkChain(ctx, t, appender, "acme", 1, []Entry{got})
}

// clusterHasInterest reports whether every server of cl knows a subscriber of subject.
func clusterHasInterest(cl *testkit.Cluster, subject string) bool {
	for i := range cl.Size() {
		acc, err := cl.Server(i).LookupAccount(jetstreamAccount)
		if err != nil || !acc.SubscriptionInterest(subject) {
			return false
		}
	}
	return true
}

// TestForwardingRidesOutLeaderChanges: charges from three nodes while LEDGER's leader steps
// down twice. Appends go to whichever node serves them, or are made locally in the gaps, and
// every charge is stored once in a chain that verifies.
func TestForwardingRidesOutLeaderChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, ls := forwardingNodes(ctx, t, true)
	_, js := cl.ConnectTo(t, 0)
	const rounds, per = 6, 30
	var got []Entry
	for r := range rounds {
		if r == 2 || r == 4 {
			stepDown(ctx, t, js, ls[0].streamName)
		}
		got = append(got, chargeAll(ctx, t, ls, "acme", fmt.Sprintf("r%d-", r), per)...)
	}
	checkChain(ctx, t, ls[0], "acme", rounds*per, got)
	if f := forwardsCounted(ls, "appended"); f == 0 {
		t.Error("no charge was forwarded")
	}
}

// stepDown asks stream's leader to step down (a leader election follows).
func stepDown(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) {
	t.Helper()
	msg, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil)
	if err != nil {
		t.Fatalf("step down: %v", err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error != nil {
		t.Fatalf("step down: %v %v", err, resp.Error)
	}
}

// TestUnsignedForwardRefused: with a keyed chain, the appender appends only what a holder of
// the secret sent. A request without a MAC, or with one under another secret, is refused and
// stores nothing; else anyone who can publish on the account could have entries signed.
func TestUnsignedForwardRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, ls := forwardingNodes(ctx, t, true)
	nc, _ := cl.ConnectTo(t, 1)
	body, err := json.Marshal(forwardRequest{E: Entry{ID: "forged", Kind: KindCharge, Tenant: "acme", KeyHash: "k1",
		JobID: "j1", Model: "m", CostMicros: 1_000_000, Currency: "USD", Time: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, mac string }{
		{"no MAC", ""},
		{"a MAC under another secret", hex.EncodeToString(requestMAC([]byte("another secret, also 32 bytes long!"), body))},
		{"a MAC of other bytes", hex.EncodeToString(requestMAC(forwardSecret, append([]byte(" "), body...)))},
	} {
		m := nats.NewMsg(ls[0].forwardSubject())
		m.Data = body
		if tc.mac != "" {
			m.Header.Set(macHeader, tc.mac)
		}
		rep, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got forwardReply
		if err := json.Unmarshal(rep.Data, &got); err != nil || got.Err != errUnsigned.Error() {
			t.Errorf("%s: answered %s (%v), want the refusal %q", tc.name, rep.Data, err, errUnsigned)
		}
	}
	es, err := ls[0].Entries(ctx, "acme", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 0 {
		t.Fatalf("the ledger holds %d entries after unsigned requests, want 0", len(es))
	}
	// Signed under the ledger's secret, the same request is appended (and signed).
	m := nats.NewMsg(ls[0].forwardSubject())
	m.Data, m.Header = body, nats.Header{macHeader: []string{hex.EncodeToString(requestMAC(forwardSecret, body))}}
	rep, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	var got forwardReply
	if err := json.Unmarshal(rep.Data, &got); err != nil || got.Err != "" || !got.Created || !Keyed(&got.E) {
		t.Fatalf("signed request answered %s (%v); want the entry created and keyed", rep.Data, err)
	}
}
