package e2e

// Row 9 of the resilience table: a gateway in front of a gateway (backend type oncegate). The
// outer forwards a stable Idempotency-Key; when the inner is slow to answer, the outer asks
// the inner's GET /v1/idempotency/{key}, sees the call running, and keeps waiting instead of
// re-sending.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// proxyCall is one request the recording proxy passed to the inner gateway.
type proxyCall struct {
	method, path, key, state string
}

// recordingProxy is a reverse proxy to target on 127.0.0.1 that records every request, and
// the state answered to GET /v1/idempotency/{key}.
func recordingProxy(t testing.TB, target string) (string, func() []proxyCall) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []proxyCall
	tr := &http.Transport{}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport: tr,
		ModifyResponse: func(resp *http.Response) error {
			c := proxyCall{method: resp.Request.Method, path: resp.Request.URL.Path, key: resp.Request.Header.Get("Idempotency-Key")}
			if strings.HasPrefix(c.path, "/v1/idempotency/") {
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					return err
				}
				resp.Body = io.NopCloser(bytes.NewReader(b))
				var st struct {
					State string `json:"state"`
				}
				_ = json.Unmarshal(b, &st)
				c.state = fmt.Sprintf("%d %s", resp.StatusCode, st.State)
			}
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
			return nil
		},
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return srv.URL, func() []proxyCall {
		mu.Lock()
		defer mu.Unlock()
		return append([]proxyCall(nil), calls...)
	}
}

func TestChainGatewayInFrontOfGateway(t *testing.T) {
	inner := gatewaykit.StartGateway(t, nil)
	innerSlow := inner.Mock(t, "slowmock")
	proxyURL, calls := recordingProxy(t, inner.URL)

	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("inner", config.TypeOncegate, proxyURL+"/v1", "oncegate-mock-slow")
	b.FirstByteTimeout = config.Duration(100 * time.Millisecond)
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock-slow", Backends: []string{"inner"}}}
	outer := gatewaykit.StartGateway(t, cfg)

	const msg, key = "row 9: a gateway in front of a gateway", "rs-chain"
	body := chatBody("oncegate-mock-slow", msg, "")
	want := parseCompletion(t, directMock(t, body)).Choices[0].Message.Content
	start := time.Now()
	resp := postChat(t, outer.URL, body, map[string]string{"Idempotency-Key": key})
	rb := resp.Body
	elapsed := time.Since(start)
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.Status, rb)
	}
	if got := parseCompletion(t, rb).Choices[0].Message.Content; got != want {
		t.Errorf("content %q, want %q", got, want)
	}
	if elapsed < 2*b.FirstByteTimeout.D() {
		t.Errorf("answered after %v: the slow model should outlast first_byte_timeout", elapsed)
	}
	if n := innerSlow.Stats().Requests; n != 1 {
		t.Errorf("inner executions %d, want 1", n)
	}
	if be, a := resp.Header.Get("Oncegate-Backend"), attempts(resp); be != "inner" || a != "1" {
		t.Errorf("Oncegate-Backend %q Oncegate-Attempts %q, want inner, 1", be, a)
	}
	var posts, polls []proxyCall
	for _, c := range calls() {
		switch {
		case c.method == http.MethodPost && c.path == chatPath:
			posts = append(posts, c)
		case c.method == http.MethodGet && strings.HasPrefix(c.path, "/v1/idempotency/"):
			polls = append(polls, c)
		default:
			t.Errorf("unexpected call to the inner gateway: %+v", c)
		}
	}
	if len(posts) != 1 {
		t.Fatalf("%d sends to the inner gateway, want 1", len(posts))
	}
	fwd := posts[0].key
	if !strings.HasPrefix(fwd, "oncegate-") || strings.Contains(fwd, key) {
		t.Errorf("forwarded Idempotency-Key %q: want the gateway's own key, never the client's", fwd)
	}
	var states []string
	for _, p := range polls {
		states = append(states, p.state)
		if p.path != "/v1/idempotency/"+fwd {
			t.Errorf("status poll %s, want /v1/idempotency/%s", p.path, fwd)
		}
	}
	if len(polls) == 0 || polls[0].state != "200 PENDING" {
		t.Errorf("status polls %v, want the inner's record seen running (200 PENDING)", states)
	}
	if st := idemStatus(t, inner.URL, fwd, nil); st["state"] != "COMPLETED" || st["attempts"] != float64(1) {
		t.Errorf("inner record %v", st)
	}
	resilienceRow(t, "9", "gateway → gateway (type oncegate), slow model, first_byte_timeout 100ms", "inner: 1",
		fmt.Sprintf("200 after %v; %d send, %d status polls (%s), kept waiting", elapsed.Round(10*time.Millisecond), len(posts), len(polls), strings.Join(states, ", ")))
}

// The forwarded Idempotency-Key is one per intent: the same on every attempt, another for
// another intent, never the client's.
func TestChainForwardedKeyStable(t *testing.T) {
	up := startUpstream(t, nil)
	cfg := gatewaykit.Config(t)
	cfg.Backends = append(cfg.Backends, fastRetryBackend("og", config.TypeOncegate, up.base(), "oncegate-mock"))
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"og"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	// 3 attempts for the first intent, 2 for the second: 3 retries, the retry budget's floor.
	keys := map[string][]string{}
	for i, clientKey := range []string{"rs-chain-key-a", "rs-chain-key-b"} {
		before := len(up.Hits())
		burst := 2 - i
		resp := postChat(t, gw.URL, mockBody(fmt.Sprintf("row 9: forwarded key %d", i), fmt.Sprintf(`{"fault":"error_503","fault_first_n":%d}`, burst), ""),
			map[string]string{"Idempotency-Key": clientKey})
		b := resp.Body
		if resp.Status != http.StatusOK || attempts(resp) != fmt.Sprint(burst+1) {
			t.Fatalf("status %d attempts %q: %s", resp.Status, attempts(resp), b)
		}
		for _, h := range up.Hits()[before:] {
			keys[clientKey] = append(keys[clientKey], h.key)
		}
		ks := keys[clientKey]
		if len(ks) != burst+1 {
			t.Fatalf("%d attempts reached the upstream, want %d", len(ks), burst+1)
		}
		for j, k := range ks {
			if k != ks[0] || !strings.HasPrefix(k, "oncegate-") || strings.Contains(k, clientKey) {
				t.Errorf("%s attempt %d forwarded %q (first %q)", clientKey, j+1, k, ks[0])
			}
		}
	}
	if keys["rs-chain-key-a"][0] == keys["rs-chain-key-b"][0] {
		t.Errorf("two intents forwarded the same key %q", keys["rs-chain-key-a"][0])
	}
	resilienceRow(t, "9'", "type oncegate upstream, 503 for the first 2 (then 1) attempts", "3 (then 2) attempts per intent, 1 completion each",
		"200; the forwarded Idempotency-Key is identical on every attempt, differs between intents, never the client's key")
}
