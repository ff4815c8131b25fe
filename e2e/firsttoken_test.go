package e2e

// A stream that breaks before its first content token had not started for the client: the
// gateway sends it again inside the same request, the client gets one clean stream, and the
// intent is charged once; when every attempt breaks that way, the key is released, never
// frozen.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// ftGateway is a gateway whose tenants each see their own charges in the admin ledger.
func ftGateway(t *testing.T, tenants ...string) *gatewaykit.Gateway {
	t.Helper()
	cfg := gatewaykit.Config(t)
	cfg.Admin.APIKeysSHA256 = []string{sha("ft-admin")}
	for _, id := range tenants {
		cfg.Tenants = append(cfg.Tenants, config.Tenant{ID: id, APIKeysSHA256: []string{sha("sk-" + id)}})
	}
	for i := range cfg.Backends {
		if cfg.Backends[i].Name == "mock" {
			cfg.Backends[i].MaxAttempts = ftMaxAttempts
		}
	}
	return gatewaykit.StartGateway(t, cfg)
}

// ftMaxAttempts is the mock backend's max_attempts in these tests.
const ftMaxAttempts = 3

// ftIdem is GET /v1/idempotency/{key} as tenant.
func ftIdem(t *testing.T, gw *gatewaykit.Gateway, tenant, key string) map[string]any {
	t.Helper()
	return idemStatus(t, gw.URL, key, map[string]string{"Authorization": "Bearer sk-" + tenant})
}

// ftCase is one wire format: where it posts and its stream body for a message and mock knobs.
type ftCase struct {
	name, path string
	body       func(msg, knobs string) string
}

var ftCases = []ftCase{
	{"openai", chatPath, func(msg, knobs string) string {
		extra := `"stream":true`
		if knobs != "" {
			extra += `,"mock":` + knobs
		}
		return chatBody("oncegate-mock", msg, extra)
	}},
	{"anthropic", "/v1/messages", func(msg, knobs string) string {
		extra := `"stream":true,"max_tokens":16`
		if knobs != "" {
			extra += `,"mock":` + knobs
		}
		return chatBody("oncegate-mock", msg, extra)
	}},
}

// ftCharges is the tenant's ledger charges.
func ftCharges(t *testing.T, gw *gatewaykit.Gateway, tenant string) []map[string]any {
	t.Helper()
	r := do(t, http.MethodGet, gw.URL+"/v1/admin/ledger?tenant="+tenant, "", map[string]string{"Authorization": "Bearer ft-admin"})
	b := r.Body
	if r.Status != http.StatusOK {
		t.Fatalf("admin ledger: %d %s", r.Status, b)
	}
	var entries struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(b, &entries); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range entries.Data {
		if e["kind"] == "charge" {
			out = append(out, e)
		}
	}
	return out
}

// TestStreamBrokenBeforeFirstTokenIsRetried: the stream breaks before its first token on the
// first attempt only: after its opening events (the role chunk; message_start and
// content_block_start), or before any byte. The client gets the same bytes a clean run gets,
// the key ends COMPLETED after 2 attempts, and the tenant has one charge.
func TestStreamBrokenBeforeFirstTokenIsRetried(t *testing.T) {
	breaks := []struct{ name, knobs string }{
		{"after the opening events", `{"fault":"drop_after","fault_after":0,"fault_first_n":1}`},
		{"before any byte", `{"fault":"drop_start","fault_first_n":1}`},
	}
	for _, tc := range ftCases {
		for _, br := range breaks {
			t.Run(tc.name+" "+br.name, func(t *testing.T) {
				const tenant = "ft-retried"
				// A gateway each: the retry budget (retries within a share of requests) is per backend.
				gw := ftGateway(t, tenant)
				mock := gw.Mock(t, "mock")
				msg := "broken before the first token, " + tc.name + ", " + br.name
				auth := "Bearer sk-" + tenant
				clean := do(t, http.MethodPost, gw.URL+tc.path, tc.body(msg, ""), map[string]string{"Authorization": auth, "Idempotency-Key": "ft-clean"}).Body
				charged := len(waitCharges(t, gw, tenant, 1))

				before := mock.Stats().Requests
				const key = "ft-retried"
				body := tc.body(msg, br.knobs)
				resp := do(t, http.MethodPost, gw.URL+tc.path, body, map[string]string{"Authorization": auth, "Idempotency-Key": key})
				got := resp.Body
				if resp.Status != http.StatusOK {
					t.Fatalf("status %d: %s", resp.Status, got)
				}
				if !bytes.Equal(got, clean) {
					t.Errorf("stream after a break before the first token:\n%s\nwant the clean run's:\n%s", got, clean)
				}
				if a := resp.Header.Get("Oncegate-Attempts"); a != "2" {
					t.Errorf("Oncegate-Attempts %q, want 2", a)
				}
				if n := mock.Stats().Requests - before; n != 2 {
					t.Errorf("%d backend requests, want 2 (the broken one and the re-send)", n)
				}
				st := ftIdem(t, gw, tenant, key)
				if st["state"] != "COMPLETED" || st["attempts"] != float64(2) {
					t.Errorf("record state %v attempts %v, want COMPLETED after 2", st["state"], st["attempts"])
				}
				if charges := waitCharges(t, gw, tenant, charged+1); len(charges) != charged+1 {
					t.Errorf("%d charges for the completed execution, want 1: %v", len(charges)-charged, charges)
				}
				// A replay is the same stream, and costs nothing.
				retry := do(t, http.MethodPost, gw.URL+tc.path, body, map[string]string{"Authorization": auth, "Idempotency-Key": key})
				rb := retry.Body
				if retry.Header.Get("Oncegate-Idempotency") != "replayed" || !bytes.Equal(rb, got) {
					t.Errorf("same-key retry (%s) differs from the live stream", retry.Header.Get("Oncegate-Idempotency"))
				}
			})
		}
	}
}

// waitCharges waits until the tenant has at least want charges (the charge follows the
// answer) and returns them all: with the record COMPLETED, every charge of it is written by then.
func waitCharges(t *testing.T, gw *gatewaykit.Gateway, tenant string, want int) []map[string]any {
	t.Helper()
	var charges []map[string]any
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		charges = ftCharges(t, gw, tenant)
		if len(charges) < want {
			return fmt.Errorf("%d charges for %s, want %d", len(charges), tenant, want)
		}
		return nil
	})
	return charges
}

// TestStreamBrokenBeforeFirstTokenEveryAttempt: every attempt breaks before the first token.
// The key is released (FAILED, retryable): the client is told a retry is safe, a retry with
// the key executes again, and nothing was charged.
func TestStreamBrokenBeforeFirstTokenEveryAttempt(t *testing.T) {
	for _, tc := range ftCases {
		t.Run(tc.name, func(t *testing.T) {
			// A gateway each: the retry budget (retries within a share of requests) is per backend.
			gw := ftGateway(t, "ft-every")
			mock := gw.Mock(t, "mock")
			key := "ft-every-" + tc.name
			hdr := map[string]string{"Authorization": "Bearer sk-ft-every", "Idempotency-Key": key}
			body := tc.body("every attempt breaks before the first token, "+tc.name, `{"fault":"drop_after","fault_after":0}`)
			before := mock.Stats().Requests
			resp := do(t, http.MethodPost, gw.URL+tc.path, body, hdr)
			b := resp.Body
			if resp.Status != http.StatusBadGateway || resp.Header.Get("x-should-retry") != "true" || resp.Header.Get("Retry-After") == "" {
				t.Errorf("status %d x-should-retry %q Retry-After %q, want 502, a safe retry: %s",
					resp.Status, resp.Header.Get("x-should-retry"), resp.Header.Get("Retry-After"), b)
			}
			if n := mock.Stats().Requests - before; n != ftMaxAttempts {
				t.Errorf("%d backend requests, want the backend's %d attempts", n, ftMaxAttempts)
			}
			if st := ftIdem(t, gw, "ft-every", key); st["state"] != "FAILED" {
				t.Errorf("record state %v, want FAILED (released)", st["state"])
			}
			before = mock.Stats().Requests
			retry := do(t, http.MethodPost, gw.URL+tc.path, body, hdr)
			rb := retry.Body
			if retry.Header.Get("Oncegate-Idempotency") == "replayed" || mock.Stats().Requests == before {
				t.Errorf("same-key retry %s (%d %s) did not execute again", retry.Header.Get("Oncegate-Idempotency"), retry.Status, rb)
			}
			if charges := ftCharges(t, gw, "ft-every"); len(charges) != 0 {
				t.Errorf("charges for executions that produced nothing: %v", charges)
			}
		})
	}
}

// TestStreamBrokenBeforeFirstTokenSaysHowOften: the 502 of a stream that broke before its
// first token says how many attempts broke: one when the backend allows one (issue 34: it said
// "on every attempt" after one), all of them otherwise.
func TestStreamBrokenBeforeFirstTokenSaysHowOften(t *testing.T) {
	for _, tc := range []struct {
		maxAttempts int
		want        string
	}{
		{1, "before its first token on its only attempt;"},
		{3, "before its first token on all 3 attempts;"},
	} {
		t.Run(fmt.Sprintf("max_attempts=%d", tc.maxAttempts), func(t *testing.T) {
			cfg := gatewaykit.Config(t)
			for i := range cfg.Backends {
				if cfg.Backends[i].Name == "mock" {
					cfg.Backends[i].MaxAttempts = tc.maxAttempts
				}
			}
			gw := gatewaykit.StartGateway(t, cfg)
			body := ftCases[0].body(fmt.Sprintf("broken %d times", tc.maxAttempts), `{"fault":"drop_after","fault_after":0}`)
			r := postChat(t, gw.URL, body, nil)
			if r.Status != http.StatusBadGateway || !strings.Contains(string(r.Body), tc.want) {
				t.Fatalf("status %d body %s; want 502 saying %q", r.Status, r.Body, tc.want)
			}
		})
	}
}
