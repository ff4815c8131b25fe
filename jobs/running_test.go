package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// TestRunningIsAnsweredByTheOwnerOnly: a pool answers for the epochs it runs and only those;
// another pool's silence does not hide the owner's answer; nobody subscribed, a pool that
// stopped answering and a cancelled ask are all "not running".
func TestRunningIsAnsweredByTheOwnerOnly(t *testing.T) {
	srv := testkit.RunJetStream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ask := srv.NC
	if running, err := jobs.Running(ctx, ask, "k1", 1); running || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no pool subscribed: running %v, %v; want no responders", running, err)
	}

	var mu sync.Mutex
	runs := map[string]int{"k1": 2} // the owner runs epoch 2 of k1
	connect := func() *nats.Conn {
		nc, err := srv.Server.Connect("pool")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	owner, other := connect(), connect()
	sub, err := jobs.AnswerRunning(owner, func(key string, epoch int) bool {
		mu.Lock()
		defer mu.Unlock()
		e, ok := runs[key]
		return ok && e == epoch
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.AnswerRunning(other, func(string, int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*nats.Conn{owner, other} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		key   string
		epoch int
		want  bool
	}{
		{"k1", 2, true},
		{"k1", 1, false}, // an earlier epoch: whoever ran it, the record has moved on
		{"k1", 3, false},
		{"k2", 2, false},
	}
	for _, c := range cases {
		got, err := jobs.Running(ctx, ask, c.key, c.epoch)
		if got != c.want || (err == nil) != c.want {
			t.Errorf("Running(%s, %d) = %v, %v; want %v", c.key, c.epoch, got, err, c.want)
		}
	}
	mu.Lock()
	delete(runs, "k1") // the execution ended
	mu.Unlock()
	if running, _ := jobs.Running(ctx, ask, "k1", 2); running {
		t.Error("an ended execution: running")
	}
	mu.Lock()
	runs["k1"] = 2
	mu.Unlock()
	done, stop := context.WithCancel(ctx)
	stop()
	if running, _ := jobs.Running(done, ask, "k1", 2); running {
		t.Error("a cancelled ask: running")
	}
	if running, err := jobs.Running(ctx, ask, "k1", 2); !running {
		t.Fatalf("the owner runs it again: not running (%v)", err)
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := owner.Flush(); err != nil {
		t.Fatal(err)
	}
	// The other pool still listens and says nothing: the ask waits RunningWait out.
	if running, err := jobs.Running(ctx, ask, "k1", 2); running || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the owner unsubscribed: running %v, %v; want silence until the deadline", running, err)
	}
}

// TestRunningIsHeardAcrossServers: on a three-server cluster, an owner connected to one server
// is heard by a taker connected to another, and by itself (the sweep of the owner's own pool
// asks through the pool's connection).
func TestRunningIsHeardAcrossServers(t *testing.T) {
	c := testkit.RunCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner, _ := c.ConnectTo(t, 0)
	taker, _ := c.ConnectTo(t, 2)
	if _, err := jobs.AnswerRunning(owner, func(key string, epoch int) bool { return key == "k" && epoch == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := owner.Flush(); err != nil {
		t.Fatal(err)
	}
	for name, nc := range map[string]*nats.Conn{"another server": taker, "the owner's own connection": owner} {
		testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			if running, err := jobs.Running(ctx, nc, "k", 1); !running {
				return fmt.Errorf("asked from %s: not running (%v)", name, err)
			}
			return nil
		})
	}
}
