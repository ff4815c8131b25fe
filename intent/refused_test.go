package intent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestRefusedClaimReleased: a claim this node refused (its write ended unavailable) that the
// store took all the same, in time by its stored clock (a proposal its Raft group committed
// after the API gave up: the lease sweep's AdmitBy rule cannot tell it from a launched claim),
// is released by this node once the store answers, so nothing executes it. A refusal whose
// error was not "unavailable", or whose key holds another admission's record, is left alone.
func TestRefusedClaimReleased(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		err      error
		ours     bool // the record under the key is the refused write itself
		released bool
	}{
		{"ours, unavailable", fmt.Errorf("kv: claim: %w", jsretry.ErrUnavailable), true, true},
		{"ours, a definite refusal", kv.ErrExists, true, false},
		{"another admission's record", fmt.Errorf("kv: claim: %w", jsretry.ErrUnavailable), false, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			key := fmt.Sprintf("refused-%d", i)
			now := time.Now()
			claim := func() *kv.Record {
				return &kv.Record{State: kv.Pending, Tenant: tenant, JobID: jobs.NewID(), Epoch: 1, Fingerprint: "fp", Owner: kv.NewOwner(),
					Created: now, EpochStarted: now, LeaseUntil: now.Add(lease), Progress: kv.ProgressQueued, Model: "oncegate-mock",
					AdmitBy: now.Add(time.Minute)}
			}
			refused, stored := claim(), claim()
			if tc.ours {
				stored = refused
			}
			if _, err := e.store.Claim(ctx, key, stored); err != nil {
				t.Fatal(err)
			}
			e.core.NoteRefused(key, refused, tc.err)
			e.core.ReleaseRefusals(ctx)
			rec, _ := e.get(t, key)
			if got := rec.State == kv.Failed && rec.Result != nil && rec.Result.Retryable; got != tc.released {
				t.Fatalf("state %s result %+v: released=%v, want %v", rec.State, rec.Result, got, tc.released)
			}
			if !tc.released && rec.State != kv.Pending {
				t.Fatalf("state %s, want the record left PENDING", rec.State)
			}
		})
	}
}
