package jsretry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsretry"
)

func apiErr(status int, code jetstream.ErrorCode) error {
	return fmt.Errorf("nats: %w", &jetstream.APIError{Code: status, ErrorCode: code, Description: "x"})
}

// TestTransient: what an election or a reconnect answers is retried; a CAS conflict, a full
// stream, a missing stream and a closed connection are not.
func TestTransient(t *testing.T) {
	cases := []struct {
		name      string
		err       error
		transient bool
		ambiguous bool
	}{
		{"nil", nil, false, false},
		{"try deadline", fmt.Errorf("kv: %w", context.DeadlineExceeded), true, true},
		{"nats timeout", nats.ErrTimeout, true, true},
		{"no responders", nats.ErrNoResponders, true, false},
		{"no stream response", jetstream.ErrNoStreamResponse, true, false},
		{"reconnecting", nats.ErrConnectionReconnecting, true, false},
		{"cluster not available 10008", apiErr(503, 10008), true, false},
		{"not leader 10009", apiErr(500, 10009), true, false},
		{"last sequence not ready 10163", apiErr(503, 10163), true, false},
		{"duplicate message id in process 10158", apiErr(409, 10158), true, false},
		{"other 503", apiErr(503, 0), true, false},
		{"again", jsretry.Again(errors.New("stale replica")), true, false},
		{"wrong last sequence 10071", apiErr(400, jetstream.JSErrCodeStreamWrongLastSequence), false, false},
		{"wrong last sequence R3 10164", apiErr(400, jetstream.JSErrCodeStreamWrongLastSequenceConstant), false, false},
		{"maximum messages 10077", apiErr(503, 10077), false, false},
		{"jetstream not enabled", jetstream.ErrJetStreamNotEnabled, false, false},
		{"stream not found", jetstream.ErrStreamNotFound, false, false},
		{"connection closed", nats.ErrConnectionClosed, false, false},
		{"cancelled", context.Canceled, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := jsretry.Transient(tc.err); got != tc.transient {
				t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.transient)
			}
			if got := jsretry.Ambiguous(tc.err); got != tc.ambiguous {
				t.Errorf("Ambiguous(%v) = %v, want %v", tc.err, got, tc.ambiguous)
			}
		})
	}
}

// TestDo: transient failures are retried until a try succeeds; a permanent one ends it at
// once, as it is; transient failures past the window end in ErrUnavailable wrapping the last.
func TestDo(t *testing.T) {
	ctx := context.Background()
	t.Run("retries until success", func(t *testing.T) {
		n := 0
		err := jsretry.Within(ctx, func(context.Context) error {
			if n++; n < 4 {
				return nats.ErrNoResponders
			}
			return nil
		})
		if err != nil || n != 4 {
			t.Fatalf("err %v after %d tries, want nil after 4", err, n)
		}
	})
	t.Run("permanent stops at once", func(t *testing.T) {
		n := 0
		conflict := errors.New("conflict")
		err := jsretry.Within(ctx, func(context.Context) error { n++; return conflict })
		if err != conflict || n != 1 {
			t.Fatalf("err %v after %d tries, want the conflict after 1", err, n)
		}
	})
	t.Run("window ends in ErrUnavailable", func(t *testing.T) {
		n := 0
		err := jsretry.Do(ctx, time.Now().Add(200*time.Millisecond), func(context.Context) error {
			n++
			return nats.ErrNoResponders
		})
		if !errors.Is(err, jsretry.ErrUnavailable) || !errors.Is(err, nats.ErrNoResponders) || n < 2 {
			t.Fatalf("err %v after %d tries, want ErrUnavailable wrapping no responders after several", err, n)
		}
	})
	t.Run("each try has its own deadline within the caller's", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		outer, _ := cctx.Deadline()
		err := jsretry.Within(cctx, func(tctx context.Context) error {
			d, ok := tctx.Deadline()
			if !ok || d.After(outer) {
				t.Errorf("try deadline %v (set %v), want one no later than the caller's %v", d, ok, outer)
			}
			<-tctx.Done()
			return tctx.Err()
		})
		if !errors.Is(err, jsretry.ErrUnavailable) {
			t.Fatalf("err %v, want ErrUnavailable", err)
		}
	})
}
