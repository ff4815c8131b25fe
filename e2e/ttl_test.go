package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestKeyReusedAfterItsTTL: a key whose record expired is a new intent: the same request
// sent after the TTL executes again and is answered at once (issue 34: with a 5 s TTL it hung).
// The TTL is shorter than both what JOBS remembers of a message id (2 min) and how long CHUNKS
// keeps a finished execution's chunks (workers.discard_chunks_after, 10 s): before, the new
// claim's job was dropped as a copy of the first one's message id, and once that was mended a
// new stream found the first execution's chunks on its subject and was refused as fenced.
func TestKeyReusedAfterItsTTL(t *testing.T) {
	t.Parallel() // processes and ports of its own; mostly waiting (CI's e2e time, issue 34)
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.TTL = config.Duration(2 * time.Second)
	cfg.Idempotency.AutoWindow = config.Duration(time.Second)
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "mock")
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			key := fmt.Sprintf("reused-after-ttl-%v", stream)
			body := chatBody(config.MockModel, "reused after its ttl", streamed(stream))
			hdr := map[string]string{"Idempotency-Key": key}
			before := mock.Stats().Requests
			expect(t, postChat(t, gw.URL, body, hdr), http.StatusOK, "created")
			testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
				if r := send(http.MethodGet, gw.URL+"/v1/idempotency/"+key, "", nil); r.Err != nil || r.Status != http.StatusNotFound {
					return fmt.Errorf("status API: %d %v, want 404 once the record expired", r.Status, r.Err)
				}
				return nil
			})
			select {
			case r := <-async(func() result { return send(http.MethodPost, gw.URL+chatPath, body, hdr) }):
				expect(t, r, http.StatusOK, "created")
			case <-time.After(15 * time.Second):
				t.Fatal("no answer 15 s after the key was reused past its TTL")
			}
			if got := mock.Stats().Requests - before; got != 2 {
				t.Errorf("backend executions = %d, want 2 (the key expired in between)", got)
			}
		})
	}
}
