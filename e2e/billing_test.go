package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestBilling: every execution that produced output is charged once in the ledger, priced
// from the config; replays cost nothing; the admin API shows entries and bills; a tenant at
// its budget gets a 429 (budget_insufficient: below the limit) with no backend call, while its replays still succeed.
func TestBilling(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Ledger.Prices = map[string]config.Price{"oncegate-mock": {InputPerMillion: 1_000_000, OutputPerMillion: 2_000_000}}
	cfg.Admin.APIKeysSHA256 = []string{sha("admin-key")}
	// One mock answer costs 1 µ per input token + 2 µ per output token: 16 tokens → 32 µ plus
	// the input. Admission estimates input (4 bytes a token) + max_tokens: about 50 µ, so
	// "capped" (60 µ a day) can afford one execution and not two.
	cfg.Tenants = []config.Tenant{
		{ID: "capped", APIKeysSHA256: []string{sha("sk-capped")}, Budget: &config.Budget{Limit: 60, Period: "day"}},
		{ID: "free", APIKeysSHA256: []string{sha("sk-free")}},
	}
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "mock")
	capped := map[string]string{"Authorization": "Bearer sk-capped", "Idempotency-Key": "bill-1"}
	body := chatBody("oncegate-mock", "charge me once", `"max_tokens":16`)

	resp := postChat(t, gw.URL, body, capped)
	first := resp.Body
	if resp.Status != http.StatusOK {
		t.Fatalf("first: %d %s", resp.Status, first)
	}
	// The charge is written after the answer, before the job is acked: poll for it.
	admin := map[string]string{"Authorization": "Bearer admin-key"}
	entries := awaitCharges(t, gw.URL, "capped")
	e := entries.Data[0]
	if len(entries.Data) != 1 || e.Kind != "charge" || e.Tenant != "capped" || e.OutputTokens != 16 || e.Estimated ||
		e.CostMicros != int64(e.InputTokens)*1+int64(e.OutputTokens)*2 {
		t.Fatalf("entries = %+v", entries.Data)
	}

	// A replay of the same intent costs nothing, and is never refused by the budget.
	resp = postChat(t, gw.URL, body, capped)
	again := resp.Body
	if resp.Status != http.StatusOK || string(again) != string(first) || resp.Header.Get("Oncegate-Idempotency") != "replayed" {
		t.Fatalf("replay: %d %s", resp.Status, resp.Header.Get("Oncegate-Idempotency"))
	}
	// A new intent would exceed the budget: 429, no backend call. The spend is below the limit,
	// so the answer says the request does not fit (budget_insufficient), not that it is reached.
	before := mock.Stats().Requests
	resp = postChat(t, gw.URL, chatBody("oncegate-mock", "one more, please", `"max_tokens":16`), map[string]string{"Authorization": "Bearer sk-capped"})
	b := resp.Body
	if resp.Status != http.StatusTooManyRequests {
		t.Fatalf("over budget: %d %s", resp.Status, b)
	}
	assertOpenAIError(t, resp, "budget_insufficient")
	if n := mock.Stats().Requests; n != before {
		t.Fatalf("backend executions %d -> %d for a refused request", before, n)
	}
	// Another tenant is not affected.
	resp = postChat(t, gw.URL, chatBody("oncegate-mock", "one more, please", `"max_tokens":16`), map[string]string{"Authorization": "Bearer sk-free"})
	b = resp.Body
	if resp.Status != http.StatusOK {
		t.Fatalf("uncapped tenant: %d %s", resp.Status, b)
	}

	// The bill: gross = net = the one charge.
	r := do(t, http.MethodGet, gw.URL+"/v1/admin/bill?tenant=capped", "", admin)
	bb := r.Body
	var bill struct {
		GrossMicros    int64 `json:"gross_micros"`
		ReversedMicros int64 `json:"reversed_micros"`
		NetMicros      int64 `json:"net_micros"`
		Charges        int   `json:"charges"`
	}
	if err := json.Unmarshal(bb, &bill); err != nil || r.Status != http.StatusOK {
		t.Fatalf("bill: %d %s", r.Status, bb)
	}
	if bill.Charges != 1 || bill.GrossMicros != e.CostMicros || bill.NetMicros != e.CostMicros || bill.ReversedMicros != 0 {
		t.Fatalf("bill = %s", bb)
	}
	// A bypassed request runs on the node that admitted it, with no record: its charge is in
	// the ledger by the time its answer is (no polling), once per copy, a stream's too; its job
	// id names nothing the jobs API can find.
	free := map[string]string{"Authorization": "Bearer sk-free", "X-Allow-Duplicate": "true"}
	charged := map[string]bool{}
	for i, extra := range []string{"", "", `"stream":true`} {
		resp := postChat(t, gw.URL, chatBody("oncegate-mock", "bypass, charge each", extra), free)
		id := resp.Header.Get("Oncegate-Job-Id")
		if resp.Status != http.StatusOK || resp.Header.Get("Oncegate-Idempotency") != "bypassed" || id == "" {
			t.Fatalf("bypass %d: %d %s job %q %s", i, resp.Status, resp.Header.Get("Oncegate-Idempotency"), id, resp.Body)
		}
		if st, err := parseChatStream(resp.Body); extra != "" && (err != nil || !st.Done || st.Content == "") {
			t.Fatalf("bypassed stream: %+v (%v)", st, err)
		}
		var entries ledgerEntries
		r := do(t, http.MethodGet, gw.URL+"/v1/admin/ledger?tenant=free", "", admin)
		if err := json.Unmarshal(r.Body, &entries); err != nil {
			t.Fatalf("admin ledger: %d %s", r.Status, r.Body)
		}
		n := 0
		for _, e := range entries.Data {
			if e.JobID == id && e.Kind == "charge" && e.OutputTokens == 16 {
				n++
			}
		}
		if n != 1 || charged[id] {
			t.Fatalf("bypass %d (job %s): %d charges of it in the ledger as it was answered, want 1: %+v", i, id, n, entries.Data)
		}
		charged[id] = true
		if r := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+id, "", free); r.Status != http.StatusNotFound {
			t.Errorf("bypass %d: GET its job: %d %s, want 404", i, r.Status, r.Body)
		}
	}

	// The admin API needs the admin key; a tenant key is refused.
	r = do(t, http.MethodGet, gw.URL+"/v1/admin/bill?tenant=capped", "", map[string]string{"Authorization": "Bearer sk-capped"})
	if r.Status != http.StatusUnauthorized {
		t.Fatalf("admin bill with a tenant key: %d", r.Status)
	}
}
