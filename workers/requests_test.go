package workers_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestStoredRequest: a request too large for its record (stored in REQUESTS) runs from its
// job message, is re-driven by the sweep from the stream when its job is gone, and is
// deleted from the stream once the record has finished.
func TestStoredRequest(t *testing.T) {
	r := start(t, 100*time.Millisecond)
	ctx := context.Background()
	for i, tc := range []struct {
		name  string
		lost  bool // the job message is gone and the lease ran out: the sweep re-drives it
		epoch int
	}{
		{name: "run from the job", epoch: 1},
		{name: "re-driven by the sweep", lost: true, epoch: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "stored" + string(rune('a'+i))
			body := `{"model":"oncegate-mock","messages":[{"role":"user","content":"` + strings.Repeat("x", kv.DefaultInlineRequestMax) + `"}]}`
			if !r.store.StoresRequest(len(body)) {
				t.Fatalf("a %d-byte request is not stored out", len(body))
			}
			rec, rev := r.claimWith(t, key, body, func(rec *kv.Record) { rec.StoreRequestOut() })
			if err := r.store.PutRequest(ctx, key, rec); err != nil {
				t.Fatal(err)
			}
			if tc.lost {
				rec.LeaseUntil = time.Now().Add(-time.Second)
				if _, err := r.store.Update(ctx, key, rec, rev); err != nil {
					t.Fatal(err)
				}
			} else if err := jobs.Submit(ctx, r.srv.JS, mustJob(t, key, rec, rev)); err != nil {
				t.Fatal(err)
			}
			got := r.waitFinal(t, key)
			if got.State != kv.Completed || got.Epoch != tc.epoch || got.Result.Status != http.StatusOK || got.RequestBytes != len(body) {
				t.Fatalf("state %s epoch %d status %d, %d request bytes kept; want COMPLETED epoch %d 200, %d",
					got.State, got.Epoch, got.Result.Status, got.RequestBytes, tc.epoch, len(body))
			}
			if n := r.mock.Mock().Stats().Requests; n != int64(i+1) {
				t.Fatalf("backend executions = %d, want %d", n, i+1)
			}
			waitAcked(t, r, key, "the job")
			if _, err := r.store.Request(ctx, key, 1); !errors.Is(err, kv.ErrRequestLost) {
				t.Fatalf("the finished record's stored request: %v, want it dropped", err)
			}
		})
	}
}
