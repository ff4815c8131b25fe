package workers

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/kv"
)

// TestTrustSent: a worker skips reading the record only for a young first delivery whose
// record's lease still runs, so a job that could be stale (taken over) is always checked.
func TestTrustSent(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	pending := func(leaseLeft time.Duration) *kv.Record {
		return &kv.Record{State: kv.Pending, LeaseUntil: now.Add(leaseLeft)}
	}
	md := func(delivered uint64, age time.Duration) *jetstream.MsgMetadata {
		return &jetstream.MsgMetadata{NumDelivered: delivered, Timestamp: now.Add(-age)}
	}
	cases := []struct {
		name string
		md   *jetstream.MsgMetadata
		rec  *kv.Record
		want bool
	}{
		{"fresh first delivery", md(1, 5*time.Millisecond), pending(15 * time.Second), true},
		{"no metadata", nil, pending(15 * time.Second), false},
		{"redelivery", md(2, 5*time.Millisecond), pending(15 * time.Second), false},
		{"waited in the queue", md(1, freshJob), pending(15 * time.Second), false},
		{"lease about to run out", md(1, 5*time.Millisecond), pending(900 * time.Millisecond), false},
		{"lease ran out (could be taken over)", md(1, 5*time.Millisecond), pending(-time.Second), false},
		{"not pending", md(1, 5*time.Millisecond), &kv.Record{State: kv.Completed, LeaseUntil: now.Add(time.Minute)}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := trustSent(tc.md, tc.rec, now); got != tc.want {
				t.Fatalf("trustSent = %v, want %v", got, tc.want)
			}
		})
	}
}
