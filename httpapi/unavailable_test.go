package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestNATSUnavailableIs503: a NATS fault that outlasted the stores' retry window, as intent
// returns it from a claim, a read or a job publish, is a 503 the SDKs retry (x-should-retry:
// true, Retry-After), never a 500.
func TestNATSUnavailableIs503(t *testing.T) {
	cause := fmt.Errorf("%w: %w", kv.ErrUnavailable, nats.ErrTimeout) // as jsretry wraps the last failure
	for name, err := range map[string]error{
		"claim":  fmt.Errorf("intent: claim: %w", fmt.Errorf("kv: claim k: %w", cause)),
		"read":   fmt.Errorf("intent: read record: %w", fmt.Errorf("kv: get k: %w", cause)),
		"submit": fmt.Errorf("intent: %w", fmt.Errorf("jobs: submit j: %w", fmt.Errorf("%w: %w", jobs.ErrUnavailable, nats.ErrNoResponders))),
	} {
		t.Run(name, func(t *testing.T) {
			ae, ok := answerOf(err)
			if !ok || ae.Status != http.StatusServiceUnavailable || ae.Retry != retryYes || ae.RetryAfter <= 0 {
				t.Fatalf("answer %+v (found %v), want a 503 with x-should-retry true and Retry-After", ae, ok)
			}
		})
	}
	if !errors.Is(jobs.ErrUnavailable, kv.ErrUnavailable) {
		t.Fatal("jobs.ErrUnavailable and kv.ErrUnavailable are not one error: the table has one row for both")
	}
}
