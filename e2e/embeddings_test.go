package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// vector is one embedding as float32s (the mock's precision).
func vector(e openai.Embedding) []float32 {
	out := make([]float32, len(e.Embedding))
	for i, x := range e.Embedding {
		out[i] = float32(x)
	}
	return out
}

// mockVector is the mock's embedding of a string input.
func mockVector(s string) []float32 {
	b, _ := json.Marshal(s)
	return mockllm.Embedding("oncegate-mock", b, mockllm.EmbeddingDimensions)
}

// ledgerEntries is GET /v1/admin/ledger's answer.
type ledgerEntries struct {
	Data []struct {
		Kind         string `json:"kind"`
		Tenant       string `json:"tenant"`
		JobID        string `json:"job_id"`
		Model        string `json:"model"`
		InputTokens  int    `json:"input_tokens"`
		OutputTokens int    `json:"output_tokens"`
		CostMicros   int64  `json:"cost_micros"`
		Estimated    bool   `json:"estimated"`
	} `json:"data"`
}

// awaitCharges reads tenant's ledger through the admin API (admin key "admin-key") until it
// holds an entry: a charge is written after the answer, before the job is acked.
func awaitCharges(t testing.TB, base, tenant string) ledgerEntries {
	t.Helper()
	var entries ledgerEntries
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		r := do(t, http.MethodGet, base+"/v1/admin/ledger?tenant="+tenant, "", map[string]string{"Authorization": "Bearer admin-key"})
		if r.Status != http.StatusOK {
			t.Fatalf("admin ledger: %d %s", r.Status, r.Body)
		}
		if err := json.Unmarshal(r.Body, &entries); err != nil || len(entries.Data) == 0 {
			return fmt.Errorf("no charge in the ledger yet: %s", r.Body)
		}
		return nil
	})
	return entries
}

// TestEmbeddingsSDK drives POST /v1/embeddings with the official OpenAI Go SDK: an identical
// request is one backend execution (the auto key), replayed byte for byte; batches pass
// through; X-Allow-Duplicate executes again; a key reused with another input is a 422; the
// usage is charged once, as input tokens only.
func TestEmbeddingsSDK(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Ledger.Prices = map[string]config.Price{"oncegate-mock": {InputPerMillion: 1_000_000, OutputPerMillion: 5_000_000}}
	cfg.Admin.APIKeysSHA256 = []string{sha("admin-key")}
	cfg.Tenants = []config.Tenant{
		{ID: "emb", APIKeysSHA256: []string{sha("x")}}, // sdkClient's key
		{ID: "billed", APIKeysSHA256: []string{sha("sk-billed")}},
	}
	cfg.Backends = append(cfg.Backends, config.Backend{Name: "embslow", Type: config.TypeMock, Models: []string{"oncegate-embed-slow"},
		Timeout: config.Duration(time.Minute), Mock: config.MockKnobs{TTFT: config.Duration(300 * time.Millisecond), Tokens: 16}})
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "mock")
	client := sdkClient(gw)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	single := func(s string) openai.EmbeddingNewParams {
		return openai.EmbeddingNewParams{Model: "oncegate-mock", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String(s)}}
	}

	t.Run("identical request is one execution", func(t *testing.T) {
		before := mock.Stats().Requests
		var r1, r2 *http.Response
		a, err := client.Embeddings.New(ctx, single("embed me once"), option.WithResponseInto(&r1))
		if err != nil {
			t.Fatalf("first: %v", err)
		}
		b, err := client.Embeddings.New(ctx, single("embed me once"), option.WithResponseInto(&r2))
		if err != nil {
			t.Fatalf("second: %v", err)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
		if o := r1.Header.Get("Oncegate-Idempotency"); o != "created" {
			t.Errorf("first: Oncegate-Idempotency = %q, want created", o)
		}
		if o := r2.Header.Get("Oncegate-Idempotency"); o != "replayed" || r2.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("second: Oncegate-Idempotency = %q, want replayed", o)
		}
		if a.RawJSON() != b.RawJSON() {
			t.Errorf("replay differs:\n%s\n%s", a.RawJSON(), b.RawJSON())
		}
		if len(a.Data) != 1 || !slices.Equal(vector(a.Data[0]), mockVector("embed me once")) || !slices.Equal(vector(b.Data[0]), vector(a.Data[0])) {
			t.Fatalf("vectors = %+v / %+v, want the mock's", a.Data, b.Data)
		}
		if a.Usage.PromptTokens != 3 || a.Usage.TotalTokens != 3 || a.Model != "oncegate-mock" {
			t.Errorf("usage/model = %+v %q", a.Usage, a.Model)
		}
		// Its job: completed, the stored body as the result; an embedding has no event stream.
		id := r1.Header.Get("Oncegate-Job-Id")
		auth := map[string]string{"Authorization": "Bearer x"}
		jr := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+id, "", auth)
		var j job
		if err := json.Unmarshal(jr.Body, &j); err != nil || j.Status != "completed" || !compactEqual(j.Result, []byte(a.RawJSON())) {
			t.Errorf("GET /v1/jobs/%s: %d %s", id, jr.Status, jr.Body)
		}
		ev := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", auth)
		expectError(t, ev, http.StatusNotFound, "not_found")
	})

	t.Run("concurrent copies share one execution", func(t *testing.T) {
		// A slower embedding backend, so the copies arrive while the first is running.
		slow := gw.Mock(t, "embslow")
		before := slow.Stats().Requests
		const copies = 8
		body := `{"model":"oncegate-embed-slow","input":["one intent","many copies"]}`
		hdr := map[string]string{"Authorization": "Bearer x", "Idempotency-Key": "emb-concurrent"}
		results := make([]<-chan result, copies)
		for i := range results {
			results[i] = async(func() result { return send(http.MethodPost, gw.URL+"/v1/embeddings", body, hdr) })
		}
		outcomes := map[string]int{}
		var first []byte
		for i, ch := range results {
			r := <-ch
			if r.Err != nil || r.Status != http.StatusOK {
				t.Fatalf("copy %d: %d %v %s", i, r.Status, r.Err, r.Body)
			}
			outcomes[r.Header.Get("Oncegate-Idempotency")]++
			if first == nil {
				first = r.Body
			} else if !bytes.Equal(r.Body, first) {
				t.Errorf("copy %d differs:\n%s\n%s", i, r.Body, first)
			}
		}
		if n := slow.Stats().Requests - before; n != 1 || outcomes["created"] != 1 || outcomes["joined"] == 0 {
			t.Errorf("backend executions = %d, outcomes %v; want 1 execution, 1 created and joined copies", n, outcomes)
		}
	})

	t.Run("batched input", func(t *testing.T) {
		inputs := []string{"first of three", "second", "the third one here"}
		before := mock.Stats().Requests
		got, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "oncegate-mock",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Data) != len(inputs) || got.Usage.PromptTokens != 3+1+4 {
			t.Fatalf("batch: %d embeddings, usage %+v", len(got.Data), got.Usage)
		}
		for i, d := range got.Data {
			if d.Index != int64(i) || !slices.Equal(vector(d), mockVector(inputs[i])) {
				t.Errorf("embedding %d (index %d) is not the mock's vector of %q", i, d.Index, inputs[i])
			}
		}
		toks, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "oncegate-mock",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokenArrays: [][]int64{{1, 2, 3}, {40, 50}}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(toks.Data) != 2 || toks.Usage.PromptTokens != 5 ||
			!slices.Equal(vector(toks.Data[1]), mockllm.Embedding("oncegate-mock", []byte("[40,50]"), mockllm.EmbeddingDimensions)) {
			t.Errorf("token arrays: %+v", toks)
		}
		if n := mock.Stats().Requests - before; n != 2 {
			t.Errorf("backend executions = %d, want 2 (one per batch)", n)
		}
	})

	t.Run("X-Allow-Duplicate executes again", func(t *testing.T) {
		before := mock.Stats().Requests
		for i := range 2 {
			var r *http.Response
			if _, err := client.Embeddings.New(ctx, single("duplicate me"), option.WithHeader("X-Allow-Duplicate", "true"),
				option.WithResponseInto(&r)); err != nil {
				t.Fatal(err)
			}
			if o := r.Header.Get("Oncegate-Idempotency"); o != "bypassed" {
				t.Errorf("request %d: Oncegate-Idempotency = %q, want bypassed", i, o)
			}
		}
		if n := mock.Stats().Requests - before; n != 2 {
			t.Errorf("backend executions = %d, want 2", n)
		}
	})

	t.Run("key reused with another input is 422", func(t *testing.T) {
		before := mock.Stats().Requests
		key := option.WithHeader("Idempotency-Key", "emb-reuse")
		if _, err := client.Embeddings.New(ctx, single("the first input"), key); err != nil {
			t.Fatal(err)
		}
		_, err := client.Embeddings.New(ctx, single("another input"), key)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnprocessableEntity || apiErr.Code != "idempotency_key_reused" {
			t.Fatalf("reuse: %v, want 422 idempotency_key_reused", err)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	t.Run("usage charged once", func(t *testing.T) {
		billed := sdkClient(gw, option.WithAPIKey("sk-billed"))
		var first *openai.CreateEmbeddingResponse
		for range 3 {
			got, err := billed.Embeddings.New(ctx, single("bill this embedding please"), option.WithHeader("Idempotency-Key", "emb-bill"))
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = got
			}
		}
		awaitCharges(t, gw.URL, "billed")
		time.Sleep(200 * time.Millisecond) // a second charge, if there were one, would be written by now
		entries := awaitCharges(t, gw.URL, "billed")
		want := int(first.Usage.PromptTokens)
		if len(entries.Data) != 1 {
			t.Fatalf("entries = %+v, want one charge", entries.Data)
		}
		e := entries.Data[0]
		if e.Kind != "charge" || e.Model != "oncegate-mock" || e.InputTokens != want || want != 4 || e.OutputTokens != 0 || e.Estimated ||
			e.CostMicros != int64(want) {
			t.Errorf("charge = %+v, want %d input tokens, 0 output, cost %d µ", e, want, want)
		}
	})

	t.Run("bad input is a 400 that changes nothing", func(t *testing.T) {
		before := mock.Stats().Requests
		hdr := map[string]string{"Authorization": "Bearer x"}
		for _, tc := range []struct {
			name, body string
			status     int
			code       string
		}{
			{"no input", `{"model":"oncegate-mock"}`, http.StatusBadRequest, "missing_required_parameter"},
			{"empty input", `{"model":"oncegate-mock","input":""}`, http.StatusBadRequest, "invalid_type"},
			{"empty array", `{"model":"oncegate-mock","input":[]}`, http.StatusBadRequest, "invalid_type"},
			{"object input", `{"model":"oncegate-mock","input":{"text":"x"}}`, http.StatusBadRequest, "invalid_type"},
			{"no model", `{"input":"x"}`, http.StatusBadRequest, "missing_required_parameter"},
			{"not JSON", `{"model":`, http.StatusBadRequest, "invalid_json"},
			{"unknown model", `{"model":"gpt-unknown","input":"x"}`, http.StatusNotFound, "model_not_found"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := do(t, http.MethodPost, gw.URL+"/v1/embeddings", tc.body, hdr)
				expectStatus(t, r, tc.status)
				assertOpenAIError(t, r, tc.code)
			})
		}
		if n := mock.Stats().Requests - before; n != 0 {
			t.Errorf("backend executions = %d, want 0", n)
		}
	})
}
