package mockllm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"testing"
)

type embeddingsAnswer struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (h *harness) embed(t *testing.T, body string) (int, []byte, embeddingsAnswer) {
	t.Helper()
	resp, b := h.fetch(t, http.MethodPost, "/v1/embeddings", body, nil)
	var a embeddingsAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("answer: %v: %s", err, b)
		}
	}
	return resp.StatusCode, b, a
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	t.Helper()
	var f64 []float64
	if err := json.Unmarshal(raw, &f64); err != nil {
		t.Fatalf("embedding %s: %v", raw, err)
	}
	out := make([]float32, len(f64))
	for i, x := range f64 {
		out[i] = float32(x)
	}
	return out
}

// TestEmbeddings: vectors are a function of (model, input) alone, in any batch; usage counts
// the input; each request is one execution in Stats; bad requests are 400/404.
func TestEmbeddings(t *testing.T) {
	forEachTransport(t, Options{}, func(t *testing.T, h *harness) {
		status, first, one := h.embed(t, `{"model":"oncegate-mock","input":"the quick brown fox"}`)
		if status != http.StatusOK || one.Object != "list" || one.Model != "oncegate-mock" || len(one.Data) != 1 {
			t.Fatalf("single: %d %s", status, first)
		}
		v := floats(t, one.Data[0].Embedding)
		if !slices.Equal(v, Embedding("oncegate-mock", []byte(`"the quick brown fox"`), EmbeddingDimensions)) {
			t.Errorf("vector %v is not Embedding's", v)
		}
		norm := 0.0
		for _, x := range v {
			norm += float64(x) * float64(x)
		}
		if math.Abs(norm-1) > 1e-5 || len(v) != EmbeddingDimensions {
			t.Errorf("vector %v: length %d, norm² %g", v, len(v), norm)
		}
		if one.Usage.PromptTokens != 4 || one.Usage.TotalTokens != 4 {
			t.Errorf("usage = %+v, want 4", one.Usage)
		}
		if _, again, _ := h.embed(t, `{"model":"oncegate-mock","input":"the quick brown fox"}`); string(again) != string(first) {
			t.Errorf("not deterministic:\n%s\n%s", first, again)
		}

		status, b, batch := h.embed(t, `{"model":"oncegate-mock","input":["a b","the quick brown fox",[1,2,3]]}`)
		if status != http.StatusOK || len(batch.Data) != 3 || batch.Usage.PromptTokens != 2+4+3 {
			t.Fatalf("batch: %d %s", status, b)
		}
		for i, d := range batch.Data {
			if d.Index != i || d.Object != "embedding" {
				t.Errorf("item %d: %+v", i, d)
			}
		}
		if !slices.Equal(floats(t, batch.Data[1].Embedding), v) {
			t.Error("an input's vector differs inside a batch")
		}
		if slices.Equal(floats(t, batch.Data[0].Embedding), v) {
			t.Error("two inputs have one vector")
		}
		if _, _, other := h.embed(t, `{"model":"oncegate-mock","input":"the quick brown fox","dimensions":3}`); len(other.Data) != 1 ||
			len(floats(t, other.Data[0].Embedding)) != 3 {
			t.Errorf("dimensions 3: %+v", other)
		}
		_, _, b64 := h.embed(t, `{"model":"oncegate-mock","input":"the quick brown fox","encoding_format":"base64"}`)
		var s string
		if len(b64.Data) != 1 || json.Unmarshal(b64.Data[0].Embedding, &s) != nil {
			t.Fatalf("base64: %+v", b64)
		}
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) != 4*EmbeddingDimensions || math.Float32frombits(binary.LittleEndian.Uint32(raw)) != v[0] {
			t.Errorf("base64 vector %q: %v", s, err)
		}

		for _, tc := range []struct {
			name, body string
			status     int
		}{
			{"no input", `{"model":"oncegate-mock"}`, http.StatusBadRequest},
			{"empty string", `{"model":"oncegate-mock","input":""}`, http.StatusBadRequest},
			{"empty array", `{"model":"oncegate-mock","input":[]}`, http.StatusBadRequest},
			{"an object", `{"model":"oncegate-mock","input":{"a":1}}`, http.StatusBadRequest},
			{"a number among strings", `{"model":"oncegate-mock","input":["a",1]}`, http.StatusBadRequest},
			{"no model", `{"input":"x"}`, http.StatusBadRequest},
			{"bad dimensions", `{"model":"oncegate-mock","input":"x","dimensions":0}`, http.StatusBadRequest},
			{"unknown model", `{"model":"oncegate-nope","input":"x"}`, http.StatusNotFound},
		} {
			if status, b, _ := h.embed(t, tc.body); status != tc.status {
				t.Errorf("%s: %d %s, want %d", tc.name, status, b, tc.status)
			}
		}
		if st := h.srv.Stats(); st.Requests != 5+8 || st.Completed != 5 || st.InFlight != 0 {
			t.Errorf("stats = %+v, want 13 requests, 5 completed", st)
		}
	})
}
