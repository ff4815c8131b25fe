package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestDuplicateStorm: 1,000 concurrent copies of one keyed intent (every third one streamed)
// against the slow mock: exactly one backend execution, one "created", identical answers. It
// logs, without asserting on time, the first-request baseline latency measured in the same run
// and how long after the leader (the "created" copy) the followers finished.
func TestDuplicateStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 concurrent requests")
	}
	gw := gatewaykit.StartGateway(t, nil)
	slow := gw.Mock(t, "slowmock")

	// Baseline: one first request of the same shape, alone.
	baseBody := chatBody(slowModel, "storm baseline", "")
	base := postChat(t, gw.URL, baseBody, map[string]string{"Idempotency-Key": "xo-storm-baseline"})
	expect(t, base, http.StatusOK, "created")
	baseline := base.End.Sub(base.Start)

	const n = 1000
	const key = "xo-storm"
	nsBody := chatBody(slowModel, "a storm of duplicates", "")
	stBody := chatBody(slowModel, "a storm of duplicates", `"stream":true`)
	_, wantContent := reference(t, nsBody)
	before := slow.Stats().Requests

	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := nsBody
			if i%3 == 0 {
				body = stBody
			}
			<-start
			results[i] = send(http.MethodPost, gw.URL+chatPath, body, map[string]string{"Idempotency-Key": key})
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)

	outcomes := map[string]int{}
	leader := -1
	var nsRef, stRef []byte
	for i, r := range results {
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("copy %d: status %d err %v body %s", i, r.Status, r.Err, r.Body)
		}
		o := r.Header.Get("Oncegate-Idempotency")
		outcomes[o]++
		if o == "created" {
			leader = i
		}
		ref := &nsRef
		if i%3 == 0 {
			ref = &stRef
		}
		if *ref == nil {
			*ref = r.Body
		} else if !bytes.Equal(r.Body, *ref) {
			t.Errorf("copy %d (%s, stream=%v): answer differs", i, o, i%3 == 0)
		}
	}
	if got := slow.Stats().Requests - before; got != 1 {
		t.Fatalf("backend executions = %d for %d copies, want 1", got, n)
	}
	if outcomes["created"] != 1 || outcomes["created"]+outcomes["joined"]+outcomes["replayed"] != n {
		t.Fatalf("outcomes %v, want one created and the rest joined or replayed", outcomes)
	}
	if _, content, err := answerOf(nsRef); err != nil || content != wantContent {
		t.Errorf("non-stream answer %q (%v), want %q", content, err, wantContent)
	}
	if st, err := parseChatStream(stRef); err != nil || st.Content != wantContent || !st.Done {
		t.Errorf("stream answer %+v (%v), want %q then [DONE]", st, err, wantContent)
	}

	lead := results[leader]
	var after []time.Duration
	for i, r := range results {
		if i != leader {
			after = append(after, r.End.Sub(lead.End))
		}
	}
	slices.Sort(after)
	pct := func(p float64) time.Duration { return after[int(p*float64(len(after)-1))] }
	t.Logf("baseline first request: %v; storm: %d copies in %v wall, outcomes %v, leader streamed: %v", baseline, n, wall, outcomes, leader%3 == 0)
	t.Logf("leader latency %v; follower finish minus leader finish: p50 %v, p99 %v, min %v, max %v",
		lead.End.Sub(lead.Start), pct(0.50), pct(0.99), after[0], after[len(after)-1])
}

// BenchmarkReplayCompletedKey: a non-stream copy of a completed keyed request, answered from
// the stored record (one KV claim attempt, one read, no backend).
func BenchmarkReplayCompletedKey(b *testing.B) {
	gw := gatewaykit.StartGateway(b, nil)
	fast := gw.Mock(b, "mock")
	body := chatBody(config.MockModel, "replay me", "")
	hdr := map[string]string{"Idempotency-Key": "xo-bench-replay"}
	if r := send(http.MethodPost, gw.URL+chatPath, body, hdr); r.Status != http.StatusOK {
		b.Fatalf("first request: %d %v %s", r.Status, r.Err, r.Body)
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			r := send(http.MethodPost, gw.URL+chatPath, body, hdr)
			if r.Status != http.StatusOK || r.Header.Get("Oncegate-Idempotency") != "replayed" {
				b.Fatalf("replay: %d %q %v", r.Status, r.Header.Get("Oncegate-Idempotency"), r.Err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r := send(http.MethodPost, gw.URL+chatPath, body, hdr)
				if r.Status != http.StatusOK || r.Header.Get("Oncegate-Idempotency") != "replayed" {
					b.Errorf("replay: %d %q %v", r.Status, r.Header.Get("Oncegate-Idempotency"), r.Err)
					return
				}
			}
		})
	})
	if n := fast.Stats().Requests; n != 1 {
		b.Fatalf("backend executions = %d, want 1", n)
	}
}

// BenchmarkJoinDuplicate: a streamed duplicate joining a running execution, timed to its first
// event (the claim attempt, the record read, attaching to the node's feed and replaying its
// history from the first chunk). One long execution (5 ms per token) runs for the whole
// benchmark and is cancelled at the end; it is the only backend execution.
func BenchmarkJoinDuplicate(b *testing.B) {
	gw := gatewaykit.StartGateway(b, nil)
	slow := gw.Mock(b, "slowmock")
	body := chatBody(slowModel, "join me", `"stream":true,"mock":{"tokens":1000000,"inter_token_ms":5}`)
	hdr := map[string]string{"Idempotency-Key": "xo-bench-join"}
	leader, err := openStream(http.MethodPost, gw.URL+chatPath, body, hdr)
	if err != nil {
		b.Fatal(err)
	}
	leaderDone := make(chan struct{})
	go func() {
		defer close(leaderDone)
		_, _ = io.Copy(io.Discard, leader.Body)
		leader.Body.Close()
	}()
	jobID := leader.Header.Get("Oncegate-Job-Id")

	join := func() error {
		resp, err := openStream(http.MethodPost, gw.URL+chatPath, body, hdr)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if o := resp.Header.Get("Oncegate-Idempotency"); resp.StatusCode != http.StatusOK || o != "joined" {
			return fmt.Errorf("join: %d %q", resp.StatusCode, o)
		}
		_, err = newSSEReader(bufio.NewReader(resp.Body)).next()
		return err
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if err := join(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := join(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})

	// Stop the execution (the job id of a chat request is indexed asynchronously).
	testkit.CheckFor(b, 10*time.Second, pollEvery, func() error {
		if r := send(http.MethodDelete, gw.URL+"/v1/jobs/"+jobID, "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("cancel of the long execution: %d %v %s", r.Status, r.Err, r.Body)
		}
		return nil
	})
	<-leaderDone
	testkit.CheckFor(b, 10*time.Second, pollEvery, inFlight(slow, 0))
	if n := slow.Stats().Requests; n != 1 {
		b.Fatalf("backend executions = %d, want 1", n)
	}
}
