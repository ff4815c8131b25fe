package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
)

// tenantsConfig is a gateway config with tenants "a" (API key sk-a) and "b" (sk-b).
func tenantsConfig(t testing.TB) *config.Config {
	cfg := gatewaykit.Config(t)
	for _, id := range []string{"a", "b"} {
		sum := sha256.Sum256([]byte("sk-" + id))
		cfg.Tenants = append(cfg.Tenants, config.Tenant{ID: id, APIKeysSHA256: []string{hex.EncodeToString(sum[:])}})
	}
	return cfg
}

// TestTenantIsolation: keys and job ids are namespaced by tenant. Tenant B using tenant A's
// Idempotency-Key with the same body gets an execution of its own; A's job and key do not
// exist for B: every way of reaching them answers exactly what a job or key that never
// existed answers.
func TestTenantIsolation(t *testing.T) {
	gw := gatewaykit.StartGateway(t, tenantsConfig(t))
	fast := gw.Mock(t, "mock")
	asA := map[string]string{"Authorization": "Bearer sk-a"}
	asB := map[string]string{"x-api-key": "sk-b"}
	with := func(h map[string]string, k, v string) map[string]string {
		m := map[string]string{k: v}
		for hk, hv := range h {
			m[hk] = hv
		}
		return m
	}
	const key = "xo-shared-key"
	body := chatBody(config.MockModel, "tenant isolation", "")

	ra := postChat(t, gw.URL, body, with(asA, "Idempotency-Key", key))
	expect(t, ra, http.StatusOK, "created")
	jobA := ra.Header.Get("Oncegate-Job-Id")
	// The job index of a chat request is written asynchronously.
	testkit.CheckFor(t, 5*time.Second, pollEvery, func() error {
		if r := send(http.MethodGet, gw.URL+"/v1/jobs/"+jobA, "", asA); r.Status != http.StatusOK {
			return fmt.Errorf("tenant A does not see its job: %d %s", r.Status, r.Body)
		}
		return nil
	})

	unknown := jobs.NewID()
	for _, p := range []struct {
		name, method, path string
		hdr                map[string]string
	}{
		{"GET job", http.MethodGet, "/v1/jobs/%s", asB},
		{"GET events", http.MethodGet, "/v1/jobs/%s/events", asB},
		{"GET events with Last-Event-ID", http.MethodGet, "/v1/jobs/%s/events", with(asB, "Last-Event-ID", "0")},
		{"GET events starting_after", http.MethodGet, "/v1/jobs/%s/events?starting_after=0", asB},
		{"DELETE job", http.MethodDelete, "/v1/jobs/%s", asB},
	} {
		t.Run(p.name, func(t *testing.T) {
			foreign := send(p.method, gw.URL+fmt.Sprintf(p.path, jobA), "", p.hdr)
			none := send(p.method, gw.URL+fmt.Sprintf(p.path, unknown), "", p.hdr)
			malformed := send(p.method, gw.URL+fmt.Sprintf(p.path, "not-a-job-id"), "", p.hdr)
			expectError(t, foreign, http.StatusNotFound, "")
			for name, r := range map[string]result{"unknown ULID": none, "malformed id": malformed} {
				if r.Status != foreign.Status || string(r.Body) != string(foreign.Body) {
					t.Errorf("B on A's job: %d %s; B on an %s: %d %s; want the same answer", foreign.Status, foreign.Body, name, r.Status, r.Body)
				}
			}
		})
	}
	// B's DELETE changed nothing.
	if r := send(http.MethodGet, gw.URL+"/v1/jobs/"+jobA, "", asA); r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(`"status":"completed"`)) {
		t.Errorf("A's job after B's DELETE: %d %s", r.Status, r.Body)
	}

	t.Run("idempotency status", func(t *testing.T) {
		foreign := send(http.MethodGet, gw.URL+"/v1/idempotency/"+url.PathEscape(key), "", asB)
		none := send(http.MethodGet, gw.URL+"/v1/idempotency/never-used-key", "", asB)
		expectError(t, foreign, http.StatusNotFound, "")
		if none.Status != foreign.Status || string(none.Body) != string(foreign.Body) {
			t.Errorf("B on A's key: %d %s; B on an unused key: %d %s; want the same answer", foreign.Status, foreign.Body, none.Status, none.Body)
		}
	})

	// B's own request with A's key: its own execution, not A's answer, not a 422.
	before := fast.Stats().Requests
	rb := postChat(t, gw.URL, body, with(asB, "Idempotency-Key", key))
	expect(t, rb, http.StatusOK, "created")
	jobB := rb.Header.Get("Oncegate-Job-Id")
	if jobB == jobA {
		t.Errorf("tenant B was given tenant A's job %s", jobA)
	}
	rb2 := postChat(t, gw.URL, chatBody(config.MockModel, "another body", ""), with(asB, "Idempotency-Key", "xo-other-key"))
	expect(t, rb2, http.StatusOK, "created")
	if got := fast.Stats().Requests - before; got != 2 {
		t.Errorf("backend executions for B = %d, want 2 (A's key and body do not exist for B)", got)
	}
	if got := idemStatus(t, gw.URL, key, asB)["job_id"]; got != jobB {
		t.Errorf("B's status of the shared key names job %v, want B's %s", got, jobB)
	}
	if got := idemStatus(t, gw.URL, key, asA)["job_id"]; got != jobA {
		t.Errorf("A's status of the shared key names job %v, want A's %s", got, jobA)
	}
	again := postChat(t, gw.URL, body, with(asA, "Idempotency-Key", key))
	expect(t, again, http.StatusOK, "replayed")
	if again.Header.Get("Oncegate-Job-Id") != jobA {
		t.Errorf("A's replay names job %s, want %s", again.Header.Get("Oncegate-Job-Id"), jobA)
	}
}

// TestTenantCraftedAutoKey: the key the gateway derives for a keyless request ("auto-<hash>")
// is echoed to its tenant and accepted back as an Idempotency-Key. Another tenant presenting
// such a key must neither learn whether the record exists nor take the record's place.
func TestTenantCraftedAutoKey(t *testing.T) {
	gw := gatewaykit.StartGateway(t, tenantsConfig(t))
	asA := map[string]string{"Authorization": "Bearer sk-a"}
	asBWith := func(key string) map[string]string {
		return map[string]string{"Authorization": "Bearer sk-b", "Idempotency-Key": key}
	}

	// The derivation is public (tenant id, path, canonical body); check the test's copy of it.
	probe := chatBody(config.MockModel, "what A asked", "")
	ra := postChat(t, gw.URL, probe, asA)
	expect(t, ra, http.StatusOK, "created")
	want, err := autoKey("a", chatPath, []byte(probe))
	if err != nil {
		t.Fatal(err)
	}
	if got := ra.Header.Get("Idempotency-Key"); got != want {
		t.Fatalf("the gateway derived %q, the test computes %q: fix autoKey", got, want)
	}

	t.Run("B cannot learn what A asked", func(t *testing.T) {
		// Found by this test: auto- keys named records with no tenant in them, and a foreign
		// record answered 422 (an oracle: did tenant a send this prompt in the last TTL?).
		rb := postChat(t, gw.URL, probe, asBWith(want))
		expect(t, rb, http.StatusOK, "created")
		foreign := send(http.MethodGet, gw.URL+"/v1/idempotency/"+want, "", map[string]string{"Authorization": "Bearer sk-b"})
		none := send(http.MethodGet, gw.URL+"/v1/idempotency/auto-"+strings.Repeat("0", 32), "", map[string]string{"Authorization": "Bearer sk-b"})
		expectError(t, foreign, http.StatusNotFound, "")
		if none.Status != foreign.Status || string(none.Body) != string(foreign.Body) {
			t.Errorf("B's status of A's auto key: %d %s; of an unknown auto key: %d %s; want the same", foreign.Status, foreign.Body, none.Status, none.Body)
		}
	})

	t.Run("B cannot block A's future request", func(t *testing.T) {
		future := chatBody(config.MockModel, "what A will ask", "")
		k, err := autoKey("a", chatPath, []byte(future))
		if err != nil {
			t.Fatal(err)
		}
		rb := postChat(t, gw.URL, future, asBWith(k))
		expect(t, rb, http.StatusOK, "created")
		// Found by this test: A then got 422 for its own keyless request, for the key's TTL.
		r := postChat(t, gw.URL, future, asA)
		expect(t, r, http.StatusOK, "created")
	})
}
