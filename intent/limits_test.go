package intent_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/kv"
)

// capped gives tenant the caps l on a core.
func capped(l intent.Limits) func(*intent.Deps) {
	return func(d *intent.Deps) { d.Options.Limits = map[string]intent.Limits{tenant: l} }
}

// limited checks that admitting req fails with a LimitError on cap (retryable, with a
// Retry-After) and, for a new intent, writes nothing.
func (e *env) limited(t *testing.T, c *intent.Core, req *intent.Request, limit string) *intent.LimitError {
	t.Helper()
	adm, err := c.Admit(context.Background(), req)
	var le *intent.LimitError
	if !errors.As(err, &le) || !errors.Is(err, intent.ErrTenantLimit) || le.Limit != limit {
		if adm != nil {
			adm.Close()
		}
		t.Fatalf("admit above the %s cap: %v (admission %v), want a LimitError on %s", limit, err, adm, limit)
	}
	if !le.TooLarge && le.RetryAfter <= 0 {
		t.Fatalf("a %s refusal says no Retry-After: %+v", limit, le)
	}
	return le
}

// noRecord checks that key has no record (a refused new intent wrote nothing).
func (e *env) noRecord(t *testing.T, key string) {
	t.Helper()
	if _, _, err := e.store.Get(context.Background(), key); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a refused request left a record (get: %v)", err)
	}
}

func streaming(key string) *intent.Request {
	req := request(key)
	req.Stream = true
	return req
}

// TestTenantLimits: each cap refuses what is above it with a LimitError and writes nothing,
// leaves other tenants alone, and gives back what it held when the answer is delivered.
func TestTenantLimits(t *testing.T) {
	t.Run("executions: new intents refused, copies join", func(t *testing.T) {
		e := newEnv(t, nil)
		core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, capped(intent.Limits{Executions: 2}))
		a1 := admit(t, core, request("x1"))
		admit(t, core, request("x2"))
		e.limited(t, core, request("x3"), "executions")
		e.noRecord(t, request("x3").Key)
		if c := admit(t, core, request("x1")); c.Outcome != intent.Joined {
			t.Fatalf("a copy above the executions cap: %s, want joined", c.Outcome)
		}
		other := request("y1")
		other.Tenant, other.Key = "globex", intent.RecordKey(1, "globex", "y1")
		if a := admit(t, core, other); a.Outcome != intent.Created {
			t.Fatalf("another tenant: %s, want created", a.Outcome)
		}
		a1.Done()
		a1.Done()
		if a := admit(t, core, request("x3")); a.Outcome != intent.Created {
			t.Fatalf("after one answer: %s, want created", a.Outcome)
		}
		e.limited(t, core, request("x4"), "executions")
	})

	t.Run("streams: new and joined streams count, non-stream copies do not", func(t *testing.T) {
		e := newEnv(t, nil)
		core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, capped(intent.Limits{Streams: 2}))
		s1 := admit(t, core, streaming("s1"))
		j1 := admit(t, core, streaming("s1"))
		if j1.Outcome != intent.Joined {
			t.Fatalf("second copy: %s", j1.Outcome)
		}
		e.limited(t, core, streaming("s1"), "streams") // a third stream, even a copy
		e.limited(t, core, streaming("s2"), "streams") // a new one
		e.noRecord(t, streaming("s2").Key)
		if c := admit(t, core, request("s1")); c.Outcome != intent.Joined {
			t.Fatalf("a non-stream copy above the streams cap: %s, want joined", c.Outcome)
		}
		j1.Done()
		if a := admit(t, core, streaming("s2")); a.Outcome != intent.Created {
			t.Fatalf("after a stream ended: %s, want created", a.Outcome)
		}
		s1.Done()
		if a := admit(t, core, streaming("s1")); a.Outcome != intent.Joined {
			t.Fatalf("after the first stream ended: %s, want joined", a.Outcome)
		}
	})

	t.Run("followers per job", func(t *testing.T) {
		e := newEnv(t, nil)
		core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, capped(intent.Limits{FollowersPerJob: 3}))
		first := admit(t, core, request("f"))
		admit(t, core, request("f"))
		j := admit(t, core, request("f"))
		e.limited(t, core, request("f"), "followers_per_job")
		if a := admit(t, core, request("g")); a.Outcome != intent.Created {
			t.Fatalf("another job: %s, want created", a.Outcome)
		}
		j.Done()
		if a := admit(t, core, request("f")); a.Outcome != intent.Joined {
			t.Fatalf("after a copy left: %s, want joined", a.Outcome)
		}
		// A finished execution is replayed to any number of copies.
		e.take(t, first.Key)
		e.finish(t, first.Key, kv.Completed, kv.Result{Status: http.StatusOK, Body: []byte(`{"ok":true}`)})
		for range 5 {
			if a := admit(t, core, request("f")); a.Outcome != intent.Replayed {
				t.Fatalf("a copy of the finished job: %s, want replayed", a.Outcome)
			}
		}
	})

	t.Run("requests per second: every request, refilled by the clock", func(t *testing.T) {
		e := newEnv(t, nil)
		core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, capped(intent.Limits{RequestsPerSecond: 2, Burst: 3}))
		admit(t, core, request("r1"))
		admit(t, core, request("r1")) // a copy costs a request too
		admit(t, core, request("r2"))
		le := e.limited(t, core, request("r3"), "requests_per_second")
		if le.RetryAfter > 500*time.Millisecond {
			t.Fatalf("Retry-After %s for one request at 2/s", le.RetryAfter)
		}
		e.noRecord(t, request("r3").Key)
		e.clock.Add(500 * time.Millisecond) // one request's worth
		admit(t, core, request("r3"))
		e.limited(t, core, request("r4"), "requests_per_second")
		e.clock.Add(10 * time.Second) // refilled to the burst, not beyond
		for _, k := range []string{"r4", "r5", "r6"} {
			admit(t, core, request(k))
		}
		e.limited(t, core, request("r7"), "requests_per_second")
	})

	t.Run("tokens per minute: estimated at admission, given back for what never ran", func(t *testing.T) {
		e := newEnv(t, nil)
		// Each request's body is ~21 tokens, plus 100 of max_tokens.
		core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, capped(intent.Limits{TokensPerMinute: 300}))
		big := func(key string) *intent.Request { r := request(key); r.MaxTokens = 100; return r }
		admit(t, core, big("t1"))
		admit(t, core, big("t2"))
		le := e.limited(t, core, big("t3"), "tokens_per_minute")
		if le.RetryAfter <= 0 || le.RetryAfter > time.Minute {
			t.Fatalf("Retry-After %s", le.RetryAfter)
		}
		// A copy of a running intent spends nothing.
		if a := admit(t, core, big("t1")); a.Outcome != intent.Joined {
			t.Fatalf("a copy: %s, want joined", a.Outcome)
		}
		huge := request("t4")
		huge.MaxTokens = 1000
		if le := e.limited(t, core, huge, "tokens_per_minute"); !le.TooLarge {
			t.Fatalf("a request larger than the whole cap: %+v, want TooLarge", le)
		}
		e.clock.Add(time.Minute)
		admit(t, core, big("t3"))
	})
}

// TestCopyOnAnotherNodeSpendsNoTokens: a copy that reaches another node first tries to claim
// the key there (it cannot know the intent exists): the tokens it reserved for that claim are
// given back when the claim finds the key taken, so copies never use up a tenant's
// tokens per minute.
func TestCopyOnAnotherNodeSpendsNoTokens(t *testing.T) {
	e := newEnv(t, nil)
	other := e.otherNode(t, capped(intent.Limits{TokensPerMinute: 250}))
	big := func(key string) *intent.Request { r := request(key); r.MaxTokens = 100; return r }
	admit(t, e.core, big("c1"))
	for range 5 {
		if a := admit(t, other, big("c1")); a.Outcome != intent.Joined {
			t.Fatalf("a copy on the other node: %s, want joined", a.Outcome)
		}
	}
	// Its whole bucket is still there: two new intents fit, a third does not.
	admit(t, other, big("c2"))
	admit(t, other, big("c3"))
	e.limited(t, other, big("c4"), "tokens_per_minute")
}
