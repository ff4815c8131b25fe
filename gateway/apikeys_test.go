package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func sha(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// embeddedCluster starts n gateways whose embedded servers form one cluster, each with the
// configuration edit makes (nil: none).
func embeddedCluster(t *testing.T, n int, edit func(*config.Config)) []*gateway.Gateway {
	t.Helper()
	var routes []string
	listens := make([]string, n)
	for i := range listens {
		listens[i] = testkit.FreeAddr(t)
		routes = append(routes, "nats://"+listens[i])
	}
	gws := make([]*gateway.Gateway, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		cfg := gatewaykit.Config(t)
		cfg.Workers.Concurrency = 4
		cfg.NATS.Cluster = config.NATSCluster{Name: "oncegate-test", Listen: listens[i], Routes: routes, ServerName: fmt.Sprintf("n%d", i+1)}
		if edit != nil {
			edit(cfg)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { // a fresh cluster elects its meta leader once all three are up
			defer wg.Done()
			gws[i], errs[i] = start(t, cfg)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
	}
	return gws
}

// send is one request with key as its Bearer API key; it returns the status and body.
func sendKeyed(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := gatewaykit.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

const (
	keyChatBody     = `{"model":"oncegate-mock","messages":[{"role":"user","content":"run-time key"}]}`
	keyMessagesBody = `{"model":"oncegate-mock","max_tokens":16,"messages":[{"role":"user","content":"run-time key"}]}`
)

// within polls until fn returns nil, at most d after from; it fails the test with fn's last
// error otherwise, and says how long it took.
func within(t *testing.T, from time.Time, d time.Duration, what string, fn func() error) {
	t.Helper()
	for {
		err := fn()
		if err == nil {
			t.Logf("%s after %s", what, time.Since(from).Round(time.Millisecond))
			return
		}
		if time.Since(from) > d {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunTimeKeysAcrossCluster: on three gateways whose embedded servers form one cluster, a
// key added through node A's admin API authenticates on node B within a second; revoked on A,
// B refuses it within a second (its copy held the key as valid: the revocation wins) with
// the provider-format 401 on the OpenAI and the Anthropic routes. A configured key works
// beside the bucket, and revoked through the bucket it is refused too (on node C). List shows
// both keys, with their tenant, source and times.
func TestRunTimeKeysAcrossCluster(t *testing.T) {
	const admin, configured = "sk-admin-keys", "sk-acme-config"
	gws := embeddedCluster(t, 3, func(cfg *config.Config) {
		cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{sha(configured)}}, {ID: "other"}}
		cfg.Admin.APIKeysSHA256 = []string{sha(admin)}
	})
	a, b, c := "http://"+gws[0].Addr(), "http://"+gws[1].Addr(), "http://"+gws[2].Addr()
	added := "og-test-run-time-key-0001"

	if code, body := sendKeyed(t, http.MethodPost, b+"/v1/chat/completions", added, keyChatBody); code != http.StatusUnauthorized {
		t.Fatalf("before it is added: %d %s, want 401", code, body)
	}
	if code, body := sendKeyed(t, http.MethodPost, c+"/v1/chat/completions", configured, keyChatBody); code != http.StatusOK {
		t.Fatalf("configured key beside the bucket: %d %s, want 200", code, body)
	}
	code, body := sendKeyed(t, http.MethodPost, a+"/v1/admin/keys", admin, fmt.Sprintf(`{"tenant":"acme","sha256":%q}`, sha(added)))
	addedAt := time.Now()
	if code != http.StatusCreated || !strings.Contains(body, `"tenant":"acme"`) || !strings.Contains(body, sha(added)) {
		t.Fatalf("add on A: %d %s", code, body)
	}
	within(t, addedAt, time.Second, "added on A, served on B", func() error {
		if code, body := sendKeyed(t, http.MethodPost, b+"/v1/chat/completions", added, keyChatBody); code != http.StatusOK {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})

	code, body = sendKeyed(t, http.MethodDelete, a+"/v1/admin/keys/"+sha(added), admin, "")
	revokedAt := time.Now()
	if code != http.StatusOK || !strings.Contains(body, `"revoked":"`) {
		t.Fatalf("revoke on A: %d %s", code, body)
	}
	within(t, revokedAt, time.Second, "revoked on A, refused on B", func() error {
		if code, body := sendKeyed(t, http.MethodPost, b+"/v1/chat/completions", added, keyChatBody); code != http.StatusUnauthorized {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	wantErr := map[string]string{ // route → the 401 body's error object, in its provider's format
		"/v1/chat/completions": `{"error":{"message":"invalid API key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
		"/v1/messages":         `{"type":"error","error":{"type":"authentication_error","message":"invalid API key"}}`,
	}
	for route, want := range wantErr {
		body := keyMessagesBody
		if route == "/v1/chat/completions" {
			body = keyChatBody
		}
		code, got := sendKeyed(t, http.MethodPost, b+route, added, body)
		if code != http.StatusUnauthorized || !jsonEqual(got, want) {
			t.Errorf("%s on B after the revocation: %d %s, want 401 %s", route, code, got, want)
		}
	}

	code, body = sendKeyed(t, http.MethodDelete, a+"/v1/admin/keys/"+sha(configured), admin, "")
	revokedAt = time.Now()
	if code != http.StatusOK || !strings.Contains(body, `"source":"config"`) {
		t.Fatalf("revoke the configured key on A: %d %s", code, body)
	}
	within(t, revokedAt, time.Second, "configured key revoked on A, refused on C", func() error {
		if code, body := sendKeyed(t, http.MethodPost, c+"/v1/chat/completions", configured, keyChatBody); code != http.StatusUnauthorized {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})

	code, body = sendKeyed(t, http.MethodGet, c+"/v1/admin/keys", admin, "")
	var list struct {
		Data []struct {
			Hash    string    `json:"sha256"`
			Tenant  string    `json:"tenant"`
			Source  string    `json:"source"`
			Created time.Time `json:"created"`
			Revoked time.Time `json:"revoked"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Data) != 2 {
		t.Fatalf("list on C: %d %s (%v), want the two keys", code, body, err)
	}
	for i, want := range []struct{ hash, source string }{{sha(added), "runtime"}, {sha(configured), "config"}} {
		k := list.Data[i]
		if k.Hash != want.hash || k.Tenant != "acme" || k.Source != want.source || k.Created.IsZero() || k.Revoked.IsZero() {
			t.Errorf("list[%d] = %+v, want %s of acme, %s, created and revoked", i, k, want.hash, want.source)
		}
	}
}

func jsonEqual(a, b string) bool {
	var va, vb any
	if json.Unmarshal([]byte(a), &va) != nil || json.Unmarshal([]byte(b), &vb) != nil {
		return false
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return string(ja) == string(jb)
}
