package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// TestPoolGone: a pool is gone only when nobody answers for it over the whole span: a pool
// that answers, one that is subscribed but too slow to answer (a paused process), and one
// whose connection comes back within the span are not; a pool never seen or whose
// connection closed is.
func TestPoolGone(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	ctx := context.Background()
	tests := []struct {
		name string
		set  func(t *testing.T, id string)
		gone bool
		// eventually: asked until gone (the server drops a closed connection asynchronously).
		eventually bool
	}{
		{name: "answering", set: func(t *testing.T, id string) {
			nc, _ := srv.Conn(t)
			if _, err := jobs.AnswerPresence(nc, id); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "subscribed but paused", set: func(t *testing.T, id string) {
			nc, _ := srv.Conn(t)
			// The subscription exists (no "no responders"), its answer never comes in time.
			block := make(chan struct{})
			t.Cleanup(func() { close(block) })
			if _, err := nc.Subscribe("exec.pool.>", func(*nats.Msg) { <-block }); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "back within the span", set: func(t *testing.T, id string) {
			nc, _ := srv.Conn(t)
			time.AfterFunc(jobs.PresenceEvery/2, func() { _, _ = jobs.AnswerPresence(nc, id) })
		}},
		{name: "never seen", set: func(*testing.T, string) {}, gone: true},
		{name: "connection closed", set: func(t *testing.T, id string) {
			nc, _ := srv.Conn(t)
			if _, err := jobs.AnswerPresence(nc, id); err != nil {
				t.Fatal(err)
			}
			nc.Close()
		}, gone: true, eventually: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := "pool-" + tc.name
			tc.set(t, id)
			if tc.eventually {
				testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
					if !jobs.PoolGone(ctx, srv.NC, id) {
						return fmt.Errorf("pool %s not gone", id)
					}
					return nil
				})
				return
			}
			if got := jobs.PoolGone(ctx, srv.NC, id); got != tc.gone {
				t.Fatalf("PoolGone = %v, want %v", got, tc.gone)
			}
		})
	}
}
