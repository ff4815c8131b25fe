package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestBypassedSDKRetryJoins: a request sent with X-Allow-Duplicate executes every time, but an
// official SDK retries it after a timeout (x-stainless-retry-count 1, 2), and that retry must
// not execute again (issue 34: 48-65 duplicate executions per 10,000 intents). A retry joins
// the one execution of its content its SDK started; when the same content was sent twice on
// purpose (two executions listed), which one it retries cannot be told, and it executes.
func TestBypassedSDKRetryJoins(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	attempt := func(n string) map[string]string {
		return map[string]string{"X-Allow-Duplicate": "true", "x-stainless-retry-count": n}
	}
	type step struct {
		hdr     map[string]string
		outcome string
	}
	for i, tc := range []struct {
		name  string
		steps []step // the first is sent in the background; the others after it started
		execs int64  // backend executions in all
	}{
		{name: "a retry joins its attempt", steps: []step{{attempt("0"), "bypassed"}, {attempt("1"), "joined"}, {attempt("2"), "joined"}}, execs: 1},
		{name: "two on purpose, then a retry: ambiguous, executes",
			steps: []step{{attempt("0"), "bypassed"}, {attempt("0"), "bypassed"}, {attempt("1"), "bypassed"}}, execs: 3},
		// The attempt's listing waited (an election) and its retry came first: the retry
		// executes, and the attempt, when it lands, joins it.
		{name: "the retry before its attempt", steps: []step{{attempt("1"), "bypassed"}, {attempt("0"), "joined"}}, execs: 1},
		{name: "no retry count: nothing listed, the retry executes",
			steps: []step{{map[string]string{"X-Allow-Duplicate": "true"}, "bypassed"}, {attempt("1"), "bypassed"}}, execs: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := mockBody(fmt.Sprintf("bypassed, then retried %d", i), `{"inter_token_ms":100}`, "")
			before := mock.Stats().Requests
			first := async(func() result { return send(http.MethodPost, gw.URL+chatPath, body, tc.steps[0].hdr) })
			testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
				if n := mock.Stats().Requests - before; n != 1 {
					return fmt.Errorf("%d backend executions, want the first attempt's", n)
				}
				return nil
			})
			rest := make([]<-chan result, 0, len(tc.steps)-1)
			for _, s := range tc.steps[1:] {
				if s.hdr["x-stainless-retry-count"] == "0" && s.outcome == "bypassed" { // a second call on purpose: started before the retries
					expect(t, postChat(t, gw.URL, body, s.hdr), http.StatusOK, s.outcome)
					continue
				}
				rest = append(rest, async(func() result { return send(http.MethodPost, gw.URL+chatPath, body, s.hdr) }))
			}
			r0 := <-first
			expect(t, r0, http.StatusOK, tc.steps[0].outcome)
			var j int
			for _, s := range tc.steps[1:] {
				if s.hdr["x-stainless-retry-count"] == "0" && s.outcome == "bypassed" {
					continue
				}
				r := <-rest[j]
				j++
				expect(t, r, http.StatusOK, s.outcome)
				if s.outcome == "joined" && !bytes.Equal(r.Body, r0.Body) {
					t.Errorf("joined retry answered %q, want the attempt's %q", r.Body, r0.Body)
				}
			}
			if n := mock.Stats().Requests - before; n != tc.execs {
				t.Errorf("%d backend executions, want %d", n, tc.execs)
			}
		})
	}
}
