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
// job message, which names it and does not carry it (the worker reads it from the stream), is
// re-driven by the sweep from the stream when its job is gone, and is deleted from the stream
// once the record has finished. A job whose stored request is gone fails its record with a
// 503 the client may retry (nothing was sent) and calls no backend, unless the node that
// admitted it offered it to the pool (Offer): then it runs from the offer.
func TestStoredRequest(t *testing.T) {
	r := start(t, 100*time.Millisecond)
	ctx := context.Background()
	words := kv.DefaultInlineRequestMax/2 + 1 // the mock counts a prompt's tokens as its words
	body := `{"model":"oncegate-mock","messages":[{"role":"user","content":"` + strings.Repeat("w ", words) + `"}]}`
	if !r.store.StoresRequest(len(body)) {
		t.Fatalf("a %d-byte request is not stored out", len(body))
	}
	executions := int64(0)
	for i, tc := range []struct {
		name     string
		lost     bool // the job message is gone and the lease ran out: the sweep re-drives it
		unstored bool // the stored request is gone
		offered  bool // offered to the pool by the node that admitted it
		epoch    int
	}{
		{name: "run from the job", epoch: 1},
		{name: "re-driven by the sweep", lost: true, epoch: 2},
		{name: "stored request gone", unstored: true, epoch: 1},
		{name: "stored request gone, offered", unstored: true, offered: true, epoch: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "stored" + string(rune('a'+i))
			rec, rev := r.claimWith(t, key, body, func(rec *kv.Record) { rec.StoreRequestOut() })
			if !tc.unstored {
				if err := r.store.PutRequest(ctx, key, rec); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lost {
				rec.LeaseUntil = time.Now().Add(-time.Second)
				if _, err := r.store.Update(ctx, key, rec, rev); err != nil {
					t.Fatal(err)
				}
			} else {
				job := mustJob(t, key, rec, rev)
				if !job.RequestStored || len(job.Record) >= len(body) {
					t.Fatalf("the job carries %d record bytes, stored %v: want the record alone, naming REQUESTS", len(job.Record), job.RequestStored)
				}
				if tc.offered {
					defer r.pool.Offer(key, rec.Epoch, rev, rec)()
				}
				if err := jobs.Submit(ctx, r.srv.JS, job); err != nil {
					t.Fatal(err)
				}
			}
			got := r.waitFinal(t, key)
			if tc.unstored && !tc.offered {
				if got.State != kv.Failed || got.Result.Status != http.StatusServiceUnavailable || !got.Result.Retryable {
					t.Fatalf("state %s, result %+v; want FAILED 503 retryable", got.State, got.Result)
				}
			} else {
				executions++
				if got.State != kv.Completed || got.Epoch != tc.epoch || got.Result.Status != http.StatusOK || got.RequestBytes != len(body) {
					t.Fatalf("state %s epoch %d status %d, %d request bytes kept; want COMPLETED epoch %d 200, %d",
						got.State, got.Epoch, got.Result.Status, got.RequestBytes, tc.epoch, len(body))
				}
				if u := got.Result.Usage; u == nil || u.PromptTokens != words {
					t.Fatalf("usage %+v: the backend did not get the stored request (%d words)", u, words)
				}
			}
			if n := r.mock.Mock().Stats().Requests; n != executions {
				t.Fatalf("backend executions = %d, want %d", n, executions)
			}
			waitAcked(t, r, key, "the job")
			if _, err := r.store.Request(ctx, key, rec); !errors.Is(err, kv.ErrRequestLost) {
				t.Fatalf("the finished record's stored request: %v, want it dropped", err)
			}
		})
	}
}
