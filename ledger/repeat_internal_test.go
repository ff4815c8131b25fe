package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestRepeatedID: an id stored twice (a charge published again after both the dedup horizon
// and the Nats-Msg-Id window, written here raw) is reported by Verify and Reconcile, and never
// makes Reconcile reverse the charge (the reversal's id would cancel both).
func TestRepeatedID(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := EnsureStream(ctx, srv.JS); err != nil {
		t.Fatal(err)
	}
	prev := ""
	for i := range 2 {
		e := Entry{Kind: KindCharge, Tenant: "acme", KeyHash: "k", JobID: "j", Epoch: 1, Model: "m", InputTokens: 10, CostMicros: 7,
			Currency: "USD", Time: time.Date(2026, 1, 1, 0, i, 0, 0, time.UTC), PrevHash: prev}
		e.ID = ChargeID(e.KeyHash, e.JobID, e.Epoch, e.Attempt)
		e.Hash = HashOf(&e)
		prev = e.Hash
		if _, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: Subject("acme"), Data: encodeStored(&e)}); err != nil {
			t.Fatal(err)
		}
	}
	l := New(srv.JS, nil, "USD")
	es, err := l.Entries(ctx, "", time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(es); !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "id repeated") {
		t.Fatalf("Verify: %v, want the repeated id", err)
	}
	rep, err := l.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.RepeatedIDs) != 1 || len(rep.Appended) != 0 {
		t.Fatalf("report %+v: want the repeated id reported and nothing reversed", rep)
	}
	if again, err := l.Reconcile(ctx); err != nil || len(again.RepeatedIDs) != 0 {
		t.Fatalf("second report %+v, %v: the repeat is reported once", again, err)
	}
}
