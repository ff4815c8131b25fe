package e2e

import (
	"net/http"
	"testing"
	"time"
)

// TestStoreWaitFollowsClientTimeout is issue 43 item 2's rule on three stock nats-servers: the
// store loses its quorum for 15 s (two servers killed, then restarted), longer than
// admission.store_wait (10 s). A request whose client states no timeout is refused with 503
// store_unavailable when that wait ends; one whose SDK states a 40 s timeout
// (X-Stainless-Timeout, as the Go and Node SDKs send it) is held through the outage and
// answered once the store is back, by one execution.
func TestStoreWaitFollowsClientTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nats-server processes and the oncegate binary")
	}
	t.Parallel() // processes and ports of its own; mostly waiting
	procs := runNATSProcs(t, "always")
	base, _ := procs.startGateway("nats:\n  replicas: 3\n")
	expect(t, postChat(t, base, chatBody("oncegate-mock", "before the outage", ""), map[string]string{"Idempotency-Key": "before"}), http.StatusOK, "created")

	procs.Kill(1)
	procs.Kill(2)
	outage := time.Now()
	stated := async(func() result {
		return postChat(t, base, chatBody("oncegate-mock", "held through the outage", ""),
			map[string]string{"Idempotency-Key": "held", "X-Stainless-Timeout": "40"})
	})
	unstated := async(func() result {
		return postChat(t, base, chatBody("oncegate-mock", "refused in the outage", ""), map[string]string{"Idempotency-Key": "refused"})
	})
	refused := <-unstated
	refusedAfter := time.Since(outage)
	expectError(t, refused, http.StatusServiceUnavailable, "store_unavailable")
	if refusedAfter < 9*time.Second || refusedAfter > 14*time.Second {
		t.Errorf("the request without a stated timeout was refused after %s, want about admission.store_wait (10 s)", refusedAfter.Round(time.Millisecond))
	}
	time.Sleep(time.Until(outage.Add(15 * time.Second)))
	procs.Start(1)
	procs.Start(2)
	held := <-stated
	heldFor := time.Since(outage)
	expect(t, held, http.StatusOK, "created")
	if heldFor < 15*time.Second {
		t.Errorf("the held request was answered %s into a 15 s outage", heldFor.Round(time.Millisecond))
	}
	if n := backendCalls(t, base, 1, held.End); n != 2 {
		t.Errorf("%d backend calls, want 2: the request before the outage and the held one (none for the refused one)", n)
	}
	t.Logf("refused without a stated timeout after %s; held with a 40 s one and answered after %s",
		refusedAfter.Round(time.Millisecond), heldFor.Round(time.Millisecond))
}
