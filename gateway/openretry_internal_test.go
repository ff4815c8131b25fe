package gateway

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// TestOpenRetried: an open that JetStream leaves unanswered is tried again until it succeeds
// or the window ends; one refused for good is not tried again.
func TestOpenRetried(t *testing.T) {
	timeout := fmt.Errorf("effects: open bucket OG_EFFECTS: %w", context.DeadlineExceeded)
	refused := errors.New("effects: open bucket OG_EFFECTS: replicas: not allowed")
	for _, tc := range []struct {
		name      string
		failures  []error // what the tries return, in order; then nil
		window    time.Duration
		wantErr   error
		wantTries int
	}{
		{"unanswered twice, then opened", []error{timeout, nats.ErrNoResponders}, time.Minute, nil, 3},
		{"refused", []error{refused, timeout}, time.Minute, refused, 1},
		{"unanswered past the window", []error{timeout, timeout, timeout, timeout, timeout, timeout, timeout, timeout}, 0, timeout, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tries := 0
			err := openRetried(context.Background(), zerolog.Nop(), "test", tc.window, func(context.Context) error {
				tries++
				if tries <= len(tc.failures) {
					return tc.failures[tries-1]
				}
				return nil
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || tries != tc.wantTries {
				t.Errorf("err %v after %d tries, want %v after %d", err, tries, tc.wantErr, tc.wantTries)
			}
		})
	}
	t.Run("the start cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		tries := 0
		err := openRetried(ctx, zerolog.Nop(), "test", time.Minute, func(context.Context) error {
			tries++
			cancel()
			return timeout
		})
		if !errors.Is(err, context.DeadlineExceeded) || tries != 1 {
			t.Errorf("err %v after %d tries, want the try's error after 1", err, tries)
		}
	})
}
