package intent_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// bounds sets a core's admission bounds.
func bounds(maxExecutions int, maxQueueWait time.Duration, q intent.QueueWaiter) func(*intent.Deps) {
	return func(d *intent.Deps) {
		d.Options.MaxExecutions, d.Options.MaxQueueWait, d.Queue = maxExecutions, maxQueueWait, q
	}
}

// refused checks that admitting req fails with ErrOverloaded and writes nothing.
func (e *env) refused(t *testing.T, c *intent.Core, req *intent.Request) {
	t.Helper()
	adm, err := c.Admit(context.Background(), req)
	if !errors.Is(err, intent.ErrOverloaded) {
		if adm != nil {
			adm.Close()
		}
		t.Fatalf("admit at capacity: %v (outcome %v), want ErrOverloaded", err, adm)
	}
	if _, _, err := e.store.Get(context.Background(), req.Key); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a shed request left a record (get: %v)", err)
	}
}

// TestMaxExecutionsShedsNewIntentsNotCopies: a node with MaxExecutions 2 refuses a third new
// intent while two of its own are unanswered, writing nothing; copies of a running intent
// are admitted there and on another full node; an answered execution (Done, once, however
// often it is called) makes room for one more.
func TestMaxExecutionsShedsNewIntentsNotCopies(t *testing.T) {
	e := newEnv(t, nil)
	core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, bounds(2, 0, nil))
	a1 := admit(t, core, request("k1"))
	a2 := admit(t, core, request("k2"))
	if a1.Outcome != intent.Created || a2.Outcome != intent.Created {
		t.Fatalf("outcomes %s, %s", a1.Outcome, a2.Outcome)
	}
	e.refused(t, core, request("k3"))
	bypass := request("k3b")
	bypass.Bypass = true
	if _, err := core.Admit(context.Background(), bypass); !errors.Is(err, intent.ErrOverloaded) {
		t.Fatalf("a bypass at capacity: %v, want ErrOverloaded", err)
	}
	if c := admit(t, core, request("k1")); c.Outcome != intent.Joined {
		t.Fatalf("a copy at capacity: %s, want joined", c.Outcome)
	}
	// Another node, itself full with one execution of its own: a copy still joins.
	other := e.otherNode(t, bounds(1, 0, nil))
	admit(t, other, request("o1"))
	e.refused(t, other, request("o2"))
	if c := admit(t, other, request("k2")); c.Outcome != intent.Joined {
		t.Fatalf("a copy on another full node: %s, want joined", c.Outcome)
	}
	a1.Done()
	a1.Done() // a second Done gives nothing back twice
	a3 := admit(t, core, request("k3"))
	if a3.Outcome != intent.Created {
		t.Fatalf("after one answer: %s, want created", a3.Outcome)
	}
	e.refused(t, core, request("k4"))
}

// fakeQueue is a job queue whose head has waited what the test says.
type fakeQueue struct{ wait atomic.Int64 }

func (q *fakeQueue) Wait() time.Duration { return time.Duration(q.wait.Load()) }

// TestMaxQueueWaitShedsNewIntents: while the job queue's head has waited longer than
// MaxQueueWait a new intent is refused and writes nothing; a copy of a running intent joins
// and a finished one replays; once the wait is back under the bound, new intents are
// admitted.
func TestMaxQueueWaitShedsNewIntents(t *testing.T) {
	e := newEnv(t, nil)
	q := &fakeQueue{}
	core, hub := e.node(t, e.srv.NC, e.srv.JS, nil, bounds(0, time.Second, q))
	admit(t, core, request("run"))
	done := admit(t, core, request("done"))
	e.take(t, done.Key)
	e.finish(t, done.Key, kv.Completed, kv.Result{Status: http.StatusOK, Body: []byte(`{"ok":true}`)})
	// Until the node has read the terminal chunk it still follows the execution, and a copy
	// joins it there (CI saw "joined" once): wait for that, as a client's later retry would.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if hub.Following(jobs.ChunkSubject(done.Key, done.Rec.JobID, done.Rec.Epoch)) {
			return fmt.Errorf("the node still follows the finished execution")
		}
		return nil
	})
	q.wait.Store(int64(5 * time.Second))
	e.refused(t, core, request("new"))
	if c := admit(t, core, request("run")); c.Outcome != intent.Joined {
		t.Fatalf("a copy of a running intent while the queue waits: %s, want joined", c.Outcome)
	}
	if c := admit(t, core, request("done")); c.Outcome != intent.Replayed {
		t.Fatalf("a copy of a finished intent while the queue waits: %s, want replayed", c.Outcome)
	}
	q.wait.Store(int64(time.Second)) // at the bound, not over it
	if a := admit(t, core, request("new")); a.Outcome != intent.Created {
		t.Fatalf("with the queue at its bound: %s, want created", a.Outcome)
	}
}

// TestMaxBodyBytesInFlightShedsNewIntents: with MaxBodyBytesInFlight 300 bytes, new intents
// whose bodies would take the node's unanswered bodies past it are refused and write nothing;
// a copy is admitted; an answered execution gives its bytes back; a single body larger than
// the bound is admitted on an idle node.
func TestMaxBodyBytesInFlightShedsNewIntents(t *testing.T) {
	e := newEnv(t, nil)
	core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, func(d *intent.Deps) { d.Options.MaxBodyBytesInFlight = 300 })
	sized := func(key string, n int) *intent.Request {
		r := request(key)
		r.Body = append(r.Body[:0:0], make([]byte, n)...)
		return r
	}
	a1 := admit(t, core, sized("b1", 200))
	e.refused(t, core, sized("b2", 200))
	if c := admit(t, core, sized("b1", 200)); c.Outcome != intent.Joined {
		t.Fatalf("a copy past the bytes bound: %s, want joined", c.Outcome)
	}
	admit(t, core, sized("b3", 100)) // 300: at the bound, not over it
	e.refused(t, core, sized("b4", 1))
	a1.Done()
	admit(t, core, sized("b4", 150))

	idle, _ := e.node(t, e.srv.NC, e.srv.JS, nil, func(d *intent.Deps) { d.Options.MaxBodyBytesInFlight = 300 })
	if a := admit(t, idle, sized("huge", 1000)); a.Outcome != intent.Created {
		t.Fatalf("one body larger than the bound on an idle node: %s, want created", a.Outcome)
	}
	e.refused(t, idle, sized("small", 10))
}
