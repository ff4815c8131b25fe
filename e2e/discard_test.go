package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
)

// TestFinishedChunksDiscarded: with workers.discard_chunks_after set, a finished execution's
// chunks leave the CHUNKS memory stream after the grace, and its copies are still answered,
// byte for byte, from the record. With 0 they stay for the stream's retention.
func TestFinishedChunksDiscarded(t *testing.T) {
	for _, tc := range []struct {
		after     time.Duration
		wantEmpty bool
	}{{200 * time.Millisecond, true}, {0, false}} {
		t.Run(fmt.Sprintf("discard_chunks_after=%s", tc.after), func(t *testing.T) {
			cfg := gatewaykit.Config(t)
			cfg.Workers.DiscardChunksAfter = config.Duration(tc.after)
			gw := gatewaykit.StartGateway(t, cfg)
			js := gw.JetStream(t, "discard-test")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream, err := js.Stream(ctx, jobs.ChunksStream)
			if err != nil {
				t.Fatal(err)
			}
			var firsts []result
			var bodies, keys []string
			for i, stream := range []bool{false, true, false, true} {
				key := fmt.Sprintf("discard-%d", i)
				body := chatBody(config.MockModel, key, streamed(stream))
				r := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
				expect(t, r, http.StatusOK, "created")
				firsts, bodies, keys = append(firsts, r), append(bodies, body), append(keys, key)
			}
			chunks := func() uint64 {
				info, err := stream.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return info.State.Msgs
			}
			if tc.wantEmpty {
				testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
					if n := chunks(); n != 0 {
						return fmt.Errorf("CHUNKS still holds %d messages of finished executions", n)
					}
					return nil
				})
			} else {
				time.Sleep(500 * time.Millisecond) // more than the other case's grace
				if n := chunks(); n == 0 {
					t.Fatal("chunks discarded with discard_chunks_after: 0")
				}
			}
			for i := range keys {
				again := postChat(t, gw.URL, bodies[i], map[string]string{"Idempotency-Key": keys[i]})
				expect(t, again, http.StatusOK, "replayed")
				if !bytes.Equal(again.Body, firsts[i].Body) {
					t.Fatalf("%s: replay differs after the chunks went:\n got %q\nwant %q", keys[i], again.Body, firsts[i].Body)
				}
			}
		})
	}
}
