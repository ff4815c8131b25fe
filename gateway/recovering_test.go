package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/kv"
)

// reply is one answer of the API.
type reply struct {
	status int
	header http.Header
	body   string
}

// send is one request to base+path; it fails the test when no answer comes.
func send(t *testing.T, method, url, body string, hdr map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := gatewaykit.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// startGateway runs a gateway on cfg; the caller stops it.
func startGateway(ctx context.Context, cfg *config.Config) (*gateway.Gateway, error) {
	return gateway.Start(ctx, cfg, zerolog.New(io.Discard), func(string) string { return "" })
}

func stopGateway(t *testing.T, gw *gateway.Gateway) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := gw.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// holdIDEMIndex holds the IDEM bucket's index file in cfg's data dir (testkit.HoldFile): the
// next start's restore of the bucket blocks reading it until release, and then rebuilds the
// bucket from its message blocks, as after a crash with more than a million keys.
func holdIDEMIndex(t *testing.T, cfg *config.Config) (release func()) {
	t.Helper()
	return testkit.HoldFile(t, filepath.Join(cfg.DataDir, "jetstream", "jetstream", "$G", "streams", kv.BucketStream, "msgs", "index.db"))
}

// restartHeld starts a gateway on cfg in the background with its IDEM bucket's restore held
// (holdIDEMIndex); started releases the restore and returns the gateway once its start has
// returned (stopped when the test ends).
func restartHeld(t *testing.T, ctx context.Context, cfg *config.Config, log zerolog.Logger) (started func() *gateway.Gateway) {
	t.Helper()
	release := holdIDEMIndex(t, cfg)
	type result struct {
		gw  *gateway.Gateway
		err error
	}
	done := make(chan result, 1)
	go func() {
		gw, err := gateway.Start(ctx, cfg, log, func(string) string { return "" })
		done <- result{gw, err}
	}()
	return func() *gateway.Gateway {
		t.Helper()
		release()
		var r result
		select {
		case r = <-done:
		case <-ctx.Done():
			t.Fatal("the start did not return after the store was released")
		}
		if r.err != nil {
			t.Fatalf("start after the restore: %v", r.err)
		}
		t.Cleanup(func() { stopGateway(t, r.gw) })
		return r.gw
	}
}

// firstAnswer starts a gateway on cfg, sends it one keyed chat completion and stops it; it
// returns the answer, which a restarted node must replay.
func firstAnswer(t *testing.T, ctx context.Context, cfg *config.Config) reply {
	t.Helper()
	gw, err := startGateway(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := send(t, http.MethodPost, "http://"+gw.Addr()+"/v1/chat/completions", recoverBody, recoverKey)
	stopGateway(t, gw)
	if first.status != http.StatusOK {
		t.Fatalf("before the restart: %d %s", first.status, first.body)
	}
	return first
}

const recoverBody = `{"model":"oncegate-mock","messages":[{"role":"user","content":"before the restart"}]}`

var recoverKey = map[string]string{"Idempotency-Key": "recover-1"}

// replays fails the test unless base answers the request of firstAnswer with its stored
// answer, without running it on gw's backend.
func replays(t *testing.T, gw *gateway.Gateway, base string, first reply) {
	t.Helper()
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, readyzIs(base, http.StatusOK, `"status":"ready"`))
	again := send(t, http.MethodPost, base+"/v1/chat/completions", recoverBody, recoverKey)
	if again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" || again.body != first.body {
		t.Errorf("replay after the restore: %d replayed=%q\n%s\nwant the first answer:\n%s", again.status, again.header.Get("Idempotent-Replayed"), again.body, first.body)
	}
	mock, _ := gw.Backend("mock")
	if n := mock.Mock().Stats().Requests; n != 0 {
		t.Errorf("the restarted node's backend ran %d requests, want 0 (a replay)", n)
	}
}

// TestServesRecoveringWhileTheStoreIsRestored (issue 43): while a restarted node's store is
// restored, its API port answers at once: /healthz 200 (a liveness probe must not kill the
// restore, which would start over), /readyz 503 "recovering" naming the stream, every request
// 503 store_unavailable in its route's format with Retry-After; then the node serves, and a
// key written before the restart replays without a second execution. On main the port was
// not bound until the API served: every probe and request was refused.
func TestServesRecoveringWhileTheStoreIsRestored(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Listen = testkit.FreeAddr(t) // fixed: the restarted node's port is probed before its start returns
	base := "http://" + cfg.Listen
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := firstAnswer(t, ctx, cfg)
	started := restartHeld(t, ctx, cfg, zerolog.New(io.Discard))

	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, readyzIs(base, http.StatusServiceUnavailable, `"status":"recovering"`))
	var rz struct {
		Status  string   `json:"status"`
		Message string   `json:"message"`
		Streams []string `json:"streams"`
	}
	r := send(t, http.MethodGet, base+"/readyz", "", nil)
	if err := json.Unmarshal([]byte(r.body), &rz); err != nil || r.status != http.StatusServiceUnavailable ||
		len(rz.Streams) != 1 || rz.Streams[0] != kv.BucketStream || !strings.Contains(rz.Message, "restoring stream "+kv.BucketStream) {
		t.Errorf("/readyz %d %s (%v), want 503 recovering, restoring %s", r.status, r.body, err, kv.BucketStream)
	}
	if r := send(t, http.MethodGet, base+"/healthz", "", nil); r.status != http.StatusOK {
		t.Errorf("/healthz %d %s, want 200 while the store is restored", r.status, r.body)
	}
	for _, tc := range []struct {
		name, path, body, format string
	}{
		{"OpenAI", "/v1/chat/completions", recoverBody, `"code":"store_unavailable"`},
		{"Anthropic", "/v1/messages", `{"model":"oncegate-mock","max_tokens":16,"messages":[{"role":"user","content":"x"}]}`, `"type":"api_error"`},
		{"unknown URL", "/v1/nothing-here", "", `"code":"store_unavailable"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := send(t, http.MethodPost, base+tc.path, tc.body, map[string]string{"Idempotency-Key": "recover-2"})
			if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || r.header.Get("x-should-retry") != "true" ||
				!strings.Contains(r.body, tc.format) || !strings.Contains(r.body, "restoring its message store") {
				t.Errorf("%s: %d %v %s, want 503 with Retry-After and %s", tc.path, r.status, r.header, r.body, tc.format)
			}
		})
	}

	replays(t, started(), base, first)
}

// TestRandomPortIsLentWhileTheStoreIsRestored: a node on a random port (kept bound from the
// start) lends it to the recovering answers and takes it back: the API then serves on it.
func TestRandomPortIsLentWhileTheStoreIsRestored(t *testing.T) {
	cfg := gatewaykit.Config(t) // listen 127.0.0.1:0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := firstAnswer(t, ctx, cfg)
	var logged testkit.SyncBuffer
	started := restartHeld(t, ctx, cfg, zerolog.New(&logged))
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(logged.String(), "answers 503 recovering") {
			return errors.New("the recovering answers have not begun")
		}
		return nil
	})
	gw := started()
	replays(t, gw, "http://"+gw.Addr(), first)
}
