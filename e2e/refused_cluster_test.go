package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRefusedStaysRefusedCluster is issue 43 item 1's fault row on a three-server R3 cluster
// (stock nats-server processes, synced): a gateway on it loses the two servers that do not lead
// the records, so its claims reach the records' leader, which can no longer commit them, and
// every request is refused with 503 store_unavailable; while it refuses, that leader (the only
// server the gateway can use: its own) is SIGKILLed too. Then all three come back. Whatever the
// leader had taken into its log may be committed by the restarted group, with a stored time
// inside the claim's admit_by (the sweep's rule cannot tell it from a launched claim): the
// refusing node's RunRefusals must release it. No refused request may be executed: each key
// holds no record, or a released (FAILED) one with no attempt.
//
// Whether the leader's log wins the restarted group's election is the servers' race: in the
// runs that made this row, the refused claims landed in 6 of 9 (all 12 in each run that counted
// them). With the refusing node's release off (the sweep's admit_by rule on or off), 3 of 5 runs
// executed refused requests (epoch 2, re-driven by the sweep); with it, none of 4.
func TestRefusedStaysRefusedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nats-server processes and the oncegate binary")
	}
	t.Parallel() // processes and ports of its own; mostly waiting
	procs := runNATSProcs(t, "always")
	base, gw := procs.startGateway("idempotency:\n  lease: 3s\n  renew_every: 1s\nworkers:\n  sweep_every: 1s\nnats:\n  replicas: 3\n")
	expect(t, postChat(t, base, chatBody("oncegate-mock", "before the fault", ""), map[string]string{"Idempotency-Key": "before"}), http.StatusOK, "created")

	leader := procs.StreamLeader("KV_IDEM")
	if leader < 0 {
		t.Fatal("no server leads KV_IDEM")
	}
	for i := range procs.Size() {
		if i != leader {
			procs.Kill(i)
		}
	}
	// The refused requests: keyed and keyless, sent together; the leader dies 3 s into their wait.
	const n = 12
	type sent struct {
		key    string // the key their status is read under (an auto key for the keyless ones)
		result result
	}
	reqs := make([]sent, n)
	var wg sync.WaitGroup
	for i := range reqs {
		body := chatBody("oncegate-mock", fmt.Sprintf("refused on the cluster %d", i), "")
		hdr := map[string]string{}
		if i%2 == 0 {
			hdr["Idempotency-Key"] = fmt.Sprintf("refused-%d", i)
			reqs[i].key = hdr["Idempotency-Key"]
		} else {
			k, err := autoKey("anonymous", chatPath, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			reqs[i].key = k
		}
		wg.Go(func() { reqs[i].result = postChat(t, base, body, hdr) })
	}
	time.Sleep(3 * time.Second) // the fault's timing: the leader dies while the requests wait
	procs.Kill(leader)
	wg.Wait()
	for i, r := range reqs {
		if r.result.Status != http.StatusServiceUnavailable {
			t.Fatalf("request %d while the records had no quorum: %d %s, want 503", i, r.result.Status, r.result.Body)
		}
	}

	// The server that took the proposals comes back with one peer first: its log is the longer,
	// so it wins their election and commits what it took (two peers without it could elect
	// one of them and drop those entries); the third joins later.
	var others []int
	for i := range procs.Size() {
		if i != leader {
			others = append(others, i)
		}
	}
	procs.Start(leader)
	procs.Start(others[0])
	time.Sleep(5 * time.Second) // an election of the two (timeouts of 4-9 s ride on it)
	procs.Start(others[1])
	procs.WaitHealthy()
	waitReady(t, base, gw)
	// Past the claims' lease, the bucket's steady grace and several sweeps.
	deadline := time.Now().Add(25 * time.Second)
	landed := map[string]bool{}
	for time.Now().Before(deadline) {
		for _, r := range reqs {
			st := do(t, http.MethodGet, base+"/v1/idempotency/"+url.PathEscape(r.key), "", nil)
			switch s := string(st.Body); {
			case st.Status == http.StatusNotFound:
			case st.Status != http.StatusOK:
				// the store may still be settling: read again
			case strings.Contains(s, `"state":"COMPLETED"`) || !strings.Contains(s, `"attempts":0`) ||
				strings.Contains(s, `"state":"PENDING"`) && !strings.Contains(s, `"progress":"queued"`):
				t.Fatalf("refused request %s was executed: %s", r.key, s)
			default:
				landed[r.key] = true
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, r := range reqs {
		st := do(t, http.MethodGet, base+"/v1/idempotency/"+url.PathEscape(r.key), "", nil)
		if st.Status == http.StatusOK && !strings.Contains(string(st.Body), `"state":"FAILED"`) {
			t.Errorf("refused request %s: a claim that landed was not released: %s", r.key, st.Body)
		}
	}
	t.Logf("%d of %d refused claims reached the store after their refusal; none executed", len(landed), n)
	// The cluster serves again: a new intent runs once.
	expect(t, postChat(t, base, chatBody("oncegate-mock", "after the fault", ""), map[string]string{"Idempotency-Key": "after"}), http.StatusOK, "created")
}
