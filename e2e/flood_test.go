package e2e

import (
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

var (
	floodStreams  = flag.Int("flood.streams", 300, "TestStreamFloodShedsNewKeepsCopies: concurrent new streams (issue 17's check: 2000)")
	floodCapacity = flag.Int("flood.capacity", 32, "TestStreamFloodShedsNewKeepsCopies: the node's max_executions and worker slots (issue 17's check: 256)")
)

// TestStreamFloodShedsNewKeepsCopies (issue 17): flood.streams concurrent new streams (~2 s
// generations) against a node sized for flood.capacity (admission.max_executions and worker
// slots): every stream is either admitted and streamed whole, or shed with 503, Retry-After
// and x-should-retry; the backend never runs more at once than the capacity and runs exactly
// the admitted ones. Then the node is filled with flood.capacity live streams and the same
// number of copies of one of them is sent at once: every copy is served (joins are never
// shed) and the backend runs nothing more. How fast a shed request is answered is logged
// (p50/p99 from send to the full 503, in the flood and alone on the full node), not asserted.
func TestStreamFloodShedsNewKeepsCopies(t *testing.T) {
	n, capacity := *floodStreams, *floodCapacity
	cfg := gatewaykit.Config(t)
	cfg.Workers.Concurrency = capacity
	cfg.Admission = config.Admission{MaxExecutions: capacity, MaxQueueWait: config.Duration(30 * time.Second), APINodes: 1}
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "slowmock")

	// The backend's executions in flight, sampled every millisecond while the flood runs.
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if f := mock.Stats().InFlight; f > peak.Load() {
				peak.Store(f)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	before := mock.Stats().Requests
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = send(http.MethodPost, gw.URL+chatPath, slowBody(fmt.Sprintf("flood %d", i), true), nil)
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	var admitted int
	var shedTimes []time.Duration
	for i, r := range results {
		switch {
		case r.Err != nil:
			t.Fatalf("stream %d: %v", i, r.Err)
		case r.Status == http.StatusOK:
			if !strings.HasSuffix(strings.TrimSpace(string(r.Body)), "data: [DONE]") {
				t.Fatalf("stream %d admitted but not whole: %.300s", i, r.Body)
			}
			admitted++
		default:
			expectShed(t, r)
			shedTimes = append(shedTimes, r.End.Sub(r.Start))
		}
	}
	t.Logf("%d new streams against a node sized for %d: %d admitted and streamed whole, %d shed with 503 (send to full answer p50 %s, p99 %s); backend peak %d in flight",
		n, capacity, admitted, len(shedTimes), percentile(shedTimes, 50), percentile(shedTimes, 99), peak.Load())
	if admitted < capacity || len(shedTimes) == 0 {
		t.Fatalf("%d admitted and %d shed; want at least the capacity (%d) admitted and the excess shed", admitted, len(shedTimes), capacity)
	}
	if p := peak.Load(); p > int64(capacity) {
		t.Fatalf("the backend ran %d executions at once on a node sized for %d", p, capacity)
	}
	if got := mock.Stats().Requests - before; got != int64(admitted) {
		t.Fatalf("the backend ran %d executions for %d admitted streams: shed ones must never reach it", got, admitted)
	}

	// Fill the node, then flood it with copies of one of its live intents.
	var live []<-chan error
	var alone []time.Duration
	for i := range capacity {
		live = append(live, openLive(t, gw.URL, fmt.Sprintf("flood-live-%d", i), fmt.Sprintf("flood live %d", i)))
	}
	for i := range 20 { // on a full node without a flood: how long a shed takes alone
		one := send(http.MethodPost, gw.URL+chatPath, slowBody(fmt.Sprintf("flood one more %d", i), true), nil)
		expectShed(t, one)
		alone = append(alone, one.End.Sub(one.Start))
	}
	slices.Sort(alone)
	t.Logf("a new stream on the full node, alone: shed in p50 %s, max %s (20 sent one after the other)",
		alone[len(alone)/2].Round(time.Microsecond), alone[len(alone)-1].Round(time.Microsecond))
	copies := make([]result, n)
	for i := range n {
		wg.Go(func() {
			copies[i] = send(http.MethodPost, gw.URL+chatPath, slowBody("flood live 0", true), map[string]string{"Idempotency-Key": "flood-live-0"})
		})
	}
	wg.Wait()
	for i, r := range copies {
		if r.Err != nil || r.Status != http.StatusOK || !strings.HasSuffix(strings.TrimSpace(string(r.Body)), "data: [DONE]") {
			t.Fatalf("copy %d of a live intent on a full node: status %d, err %v: %.300s", i, r.Status, r.Err, r.Body)
		}
		if o := r.Header.Get("Oncegate-Idempotency"); o != "joined" && o != "replayed" {
			t.Fatalf("copy %d answered %q, want joined or replayed", i, o)
		}
	}
	for i, done := range live {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("live stream %d broke: %v", i, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("live stream %d did not end", i)
		}
	}
	if got := mock.Stats().Requests - before; got != int64(admitted+capacity) {
		t.Fatalf("the backend ran %d executions, want %d (the admitted and the %d live; copies run nothing)", got, admitted+capacity, capacity)
	}
	t.Logf("%d copies of one live intent on a full node: all served", n)
}
