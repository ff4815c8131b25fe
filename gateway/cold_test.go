package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/kv"
)

// coldConfig gives cfg a cold tier: records leave the hot bucket 4 s after their last write
// (the least hot TTL) and are kept for an hour.
func coldConfig(cfg *config.Config) *config.Config {
	cfg.Idempotency.TTL = config.Duration(time.Hour)
	cfg.Idempotency.HotTTL = config.Duration(4 * time.Second)
	cfg.Idempotency.Lease = config.Duration(2 * time.Second)
	cfg.Idempotency.RenewEvery = config.Duration(500 * time.Millisecond)
	cfg.Idempotency.AutoWindow = config.Duration(time.Second)
	cfg.Idempotency.ReplayCacheBytes = 0 // every replay reads the store
	return cfg
}

// leftHot waits until the hot bucket no longer holds any of keys' records (the record keys
// of the Idempotency-Keys of the anonymous tenant are not known here: the bucket's stream is
// read instead, for a subject of each message it still has).
func leftHot(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, kv.BucketStream)
		if err != nil {
			return err
		}
		if n := st.CachedInfo().State.Msgs; n > 0 {
			return fmt.Errorf("%s still holds %d messages", kv.BucketStream, n)
		}
		return nil
	})
}

// executions is what the gateways' mock backends were asked, in all.
func executions(t *testing.T, gws ...*gatewaykit.Gateway) int64 {
	var n int64
	for _, gw := range gws {
		n += gw.Mock(t, "mock").Stats().Requests
	}
	return n
}

// TestColdTierReplays: a record that left the hot tier (idempotency.hot_ttl) is answered from
// the cold tier until the TTL: the same request replays byte-identical (what a replay from the
// hot tier sent, a stream's events too) with no execution; another body with its key is 422;
// the status API reads it. Without the cold tier's admission the retry executes again.
func TestColdTierReplays(t *testing.T) {
	gw := gatewaykit.StartGateway(t, coldConfig(gatewaykit.Config(t)))
	js := gw.JetStream(t, "cold-test")
	type sent struct {
		key, body       string
		first, hotAgain answer
	}
	var all []*sent
	for _, stream := range []bool{false, true} {
		extra := ""
		if stream {
			extra = `"stream":true`
		}
		s := &sent{key: fmt.Sprintf("cold-%v", stream), body: chatBody(config.MockModel, fmt.Sprintf("kept cold %v", stream), extra)}
		s.first = post(t, gw, s.body, key(s.key))
		s.hotAgain = post(t, gw, s.body, key(s.key))
		if s.first.status != http.StatusOK || s.hotAgain.header.Get("Oncegate-Idempotency") != "replayed" {
			t.Fatalf("%s: %d, then %q", s.key, s.first.status, s.hotAgain.header.Get("Oncegate-Idempotency"))
		}
		all = append(all, s)
	}
	before := executions(t, gw)
	leftHot(t, js)
	for _, s := range all {
		t.Run(s.key, func(t *testing.T) {
			again := post(t, gw, s.body, key(s.key))
			if again.status != http.StatusOK || again.header.Get("Oncegate-Idempotency") != "replayed" {
				t.Fatalf("from the cold tier: %d %q %s, want 200 replayed", again.status, again.header.Get("Oncegate-Idempotency"), again.body)
			}
			if !bytes.Equal(again.body, s.hotAgain.body) {
				t.Errorf("cold replay differs from the hot replay:\ncold: %s\nhot:  %s", again.body, s.hotAgain.body)
			}
			other := post(t, gw, strings.Replace(s.body, "kept", "changed", 1), key(s.key))
			if other.status != http.StatusUnprocessableEntity {
				t.Errorf("another body with a cold key: %d %s, want 422", other.status, other.body)
			}
			st := get(t, gw.URL+"/v1/idempotency/"+s.key)
			if st.status != http.StatusOK || !bytes.Contains(st.body, []byte("completed")) {
				t.Errorf("status API of a cold key: %d %s", st.status, st.body)
			}
		})
	}
	if got := executions(t, gw) - before; got != 0 {
		t.Errorf("%d executions after the records left the hot tier, want 0", got)
	}
}

// get is a GET of url.
func get(t *testing.T, url string) answer {
	t.Helper()
	resp, err := gatewaykit.Client().Get(url)
	if err != nil {
		t.Fatalf("get %s: %v", url, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b.Bytes()}
}
