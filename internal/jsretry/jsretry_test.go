package jsretry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
		{"stream ingest queue full 10167", apiErr(429, 10167), true, false},
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

// TestIngestQueueFull: a burst of publishes larger than a stream's ingest queue gets some of
// them refused with 429 (10167, dropped unapplied: the 500s 48 concurrent 4 MiB requests got
// against the default 128 MiB queue); published through Within, every one lands, once. The
// queue is 64 KiB here, the messages 32 KiB each.
func TestIngestQueueFull(t *testing.T) {
	ns, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), DontListen: true, NoSigs: true, NoLog: true,
		StreamMaxBufferedSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BURST", Subjects: []string{"burst.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 32<<10)
	const n = 64
	burst := func(round string, publish func(ctx context.Context, subj string) error) (refused int) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = publish(ctx, fmt.Sprintf("burst.%s.%d", round, i)) })
		}
		wg.Wait()
		for _, err := range errs {
			var apiErr *jetstream.APIError
			switch {
			case err == nil:
			case errors.As(err, &apiErr) && apiErr.ErrorCode == 10167:
				refused++
			default:
				t.Fatalf("round %s: %v", round, err)
			}
		}
		return refused
	}
	once := func(ctx context.Context, subj string) error {
		_, err := js.Publish(ctx, subj, body, jetstream.WithMsgID(subj))
		return err
	}
	refused := 0
	for round := 0; refused == 0 && round < 20; round++ {
		refused = burst(fmt.Sprint("raw", round), once)
	}
	if refused == 0 {
		t.Fatal("20 bursts of 64 concurrent 32 KiB publishes into a 64 KiB ingest queue: none refused; the case is not reproduced")
	}
	before, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := burst("retried", func(ctx context.Context, subj string) error {
		return jsretry.Within(ctx, func(ctx context.Context) error { return once(ctx, subj) })
	}); got != 0 {
		t.Fatalf("%d publishes refused through Within", got)
	}
	after, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.State.Msgs - before.State.Msgs; d != n {
		t.Fatalf("the retried burst stored %d messages, want %d", d, n)
	}
	t.Logf("raw burst: %d of %d refused with 429; retried: all %d stored", refused, n, n)
}
