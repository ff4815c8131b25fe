package e2e

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

var joinSeed = flag.Int64("e2e.joinseed", 0, "seed of TestJoinPointsProperty (0: from the clock; the seed is logged)")

// TestJoinPointsProperty: a late copy of a streamed request receives exactly the creator's
// stream, byte for byte, wherever it joins: before the first token, between any two frames,
// at the end, or after completion (a replay). Invariant 2: no chunk lost or repeated at the
// join point.
//
// Join points are drawn with a seeded math/rand (the seed is logged; rerun one with
// -e2e.joinseed=N). A joiner's join point p means "right after the creator's client has read
// p events"; p past the end means "after the creator's stream ended". Each round is one slow
// stream (first token at 100 ms, then 40 tokens 10 ms apart) and 30 joiners.
func TestJoinPointsProperty(t *testing.T) {
	seed := *joinSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -e2e.joinseed=%d)", seed, seed)
	rng := rand.New(rand.NewSource(seed))

	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "slowmock")
	rounds := 3
	if testing.Short() {
		rounds = 1
	}
	const joiners = 30
	const tokens = 40
	// Events the creator's client reads: the role chunk, 40 tokens, the finish chunk, [DONE].
	const events = tokens + 3
	for round := range rounds {
		points := make([]int, joiners)
		for i := range points {
			points[i] = rng.Intn(events + 3) // a few land after the end: replays
		}
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			t.Logf("join points %v", points)
			key := fmt.Sprintf("xo-join-%d-%d", seed, round)
			body := chatBody(slowModel, fmt.Sprintf("join points round %d", round), fmt.Sprintf(`"stream":true,"mock":{"tokens":%d,"inter_token_ms":10,"ttft_ms":100}`, tokens))
			hdr := map[string]string{"Idempotency-Key": key}
			before := mock.Stats().Requests

			// gates[p] opens once the creator's client has read p events; the last gate
			// opens when its stream ended.
			gates := make([]chan struct{}, events+3)
			for i := range gates {
				gates[i] = make(chan struct{})
			}
			nOpen := 0
			openUpTo := func(n int) {
				for ; nOpen <= n && nOpen < len(gates); nOpen++ {
					close(gates[nOpen])
				}
			}

			results := make([]result, joiners)
			var wg sync.WaitGroup
			for i, p := range points {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gates[p]
					results[i] = send(http.MethodPost, gw.URL+chatPath, body, hdr)
				}()
			}

			// The creator's response starts with its first chunk (100 ms in): joiners at point
			// 0 go as soon as its record exists, before any output.
			type opened struct {
				resp *http.Response
				err  error
			}
			openc := make(chan opened, 1)
			go func() {
				resp, err := openStream(http.MethodPost, gw.URL+chatPath, body, hdr)
				openc <- opened{resp, err}
			}()
			testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
				if r := send(http.MethodGet, gw.URL+"/v1/idempotency/"+key, "", nil); r.Status != http.StatusOK {
					return fmt.Errorf("the creator's record does not exist: %d %v %s", r.Status, r.Err, r.Body)
				}
				return nil
			})
			openUpTo(0)
			o := <-openc
			if o.err != nil {
				openUpTo(len(gates))
				wg.Wait()
				t.Fatal(o.err)
			}
			resp := o.resp
			creatorOutcome := resp.Header.Get("Oncegate-Idempotency")
			r := newSSEReader(resp.Body)
			n := 0
			var readErr error
			for {
				_, err := r.next()
				if err != nil {
					if err != io.EOF {
						readErr = err
					}
					break
				}
				n++
				openUpTo(n)
			}
			resp.Body.Close()
			openUpTo(len(gates))
			wg.Wait()
			if readErr != nil {
				t.Fatalf("creator: reading the stream: %v", readErr)
			}
			creator := r.raw.Bytes()

			if resp.StatusCode != http.StatusOK || creatorOutcome != "created" {
				t.Fatalf("creator: status %d outcome %q", resp.StatusCode, creatorOutcome)
			}
			st, err := parseChatStream(creator)
			if err != nil {
				t.Fatalf("creator stream: %v", err)
			}
			if !st.Done || len(st.Data) != events {
				t.Fatalf("creator stream: %d events, done=%v; want %d events ending in [DONE]", len(st.Data), st.Done, events)
			}
			outcomes := map[string]int{}
			for i, res := range results {
				if res.Err != nil || res.Status != http.StatusOK {
					t.Errorf("joiner %d (point %d): status %d err %v body %s", i, points[i], res.Status, res.Err, res.Body)
					continue
				}
				o := res.Header.Get("Oncegate-Idempotency")
				outcomes[o]++
				if o != "joined" && o != "replayed" {
					t.Errorf("joiner %d (point %d): outcome %q", i, points[i], o)
				}
				if !bytes.Equal(res.Body, creator) {
					t.Errorf("joiner %d (point %d, %s): stream differs from the creator's\n got %q\nwant %q",
						i, points[i], o, res.Body, creator)
				}
			}
			t.Logf("joiner outcomes %v", outcomes)
			if got := mock.Stats().Requests - before; got != 1 {
				t.Errorf("backend executions = %d, want 1", got)
			}
		})
	}
}
