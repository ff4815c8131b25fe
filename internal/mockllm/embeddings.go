package mockllm

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/clock"
)

// Embeddings (POST /v1/embeddings, the OpenAI format). Like the chat mock it is deterministic:
// the vector of one input is derived from SHA-256(model \0 the input's canonical JSON), so
// the same input gives the same vector in any batch and at any position, and a different
// input (or model) a different one. Vectors have EmbeddingDimensions components (or the
// request's "dimensions", 1 to maxEmbeddingDimensions) and unit length; "encoding_format":
// "base64" sends them as base64 of little-endian float32, as OpenAI does.
//
// "input" is a string, an array of strings, an array of token ids, or an array of token-id
// arrays; usage counts a string's whitespace-separated words and a token array's length as
// its tokens (prompt_tokens = total_tokens; embeddings have no output). The options' TTFT
// (or X-Mock-TTFT-Ms) delays the answer. Every embeddings request counts in Stats.Requests,
// like a chat request: it is one backend execution.

// EmbeddingDimensions is the length of a mock embedding when the request sets no dimensions.
const EmbeddingDimensions = 8

const maxEmbeddingDimensions = 4096

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

type embeddingObject struct {
	Object    string          `json:"object"`
	Index     int             `json:"index"`
	Embedding json.RawMessage `json:"embedding"`
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type embeddingList struct {
	Object string            `json:"object"`
	Data   []embeddingObject `json:"data"`
	Model  string            `json:"model"`
	Usage  embeddingUsage    `json:"usage"`
}

func (s *Server) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	body, err := readBody(w, r)
	if err != nil {
		if r.Context().Err() == nil {
			writeError(w, http.StatusBadRequest, apiError{Message: "Could not read the request body.", Type: "invalid_request_error"})
		}
		return
	}
	var req embeddingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		bad := invalid("", "We could not parse the JSON body of your request. (mock: %v)", err)
		writeError(w, bad.status, bad.err)
		return
	}
	inputs, tokens, bad := embeddingInputs(req.Input)
	if bad == nil && req.Model == "" {
		bad = invalid("model", "you must provide a model parameter")
	}
	dims := EmbeddingDimensions
	if bad == nil && req.Dimensions != nil {
		dims = *req.Dimensions
		if dims < 1 || dims > maxEmbeddingDimensions {
			bad = invalid("dimensions", "Invalid 'dimensions': expected a value between 1 and %d.", maxEmbeddingDimensions)
		}
	}
	if bad == nil && req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		bad = invalid("encoding_format", "Invalid 'encoding_format': expected 'float' or 'base64'.")
	}
	if bad != nil {
		writeError(w, bad.status, bad.err)
		return
	}
	if !s.known[req.Model] {
		writeModelNotFound(w, req.Model)
		return
	}
	ttft := s.opts.TTFT
	if v := r.Header.Get("X-Mock-TTFT-Ms"); v != "" {
		if ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && ms >= 0 && ms <= maxDelayMs {
			ttft = time.Duration(ms) * time.Millisecond
		}
	}
	if !clock.Sleep(r.Context(), ttft) {
		return
	}
	out := embeddingList{Object: "list", Model: req.Model, Data: make([]embeddingObject, len(inputs)),
		Usage: embeddingUsage{PromptTokens: tokens, TotalTokens: tokens}}
	for i, in := range inputs {
		out.Data[i] = embeddingObject{Object: "embedding", Index: i, Embedding: encodeVector(Embedding(req.Model, in, dims), req.EncodingFormat == "base64")}
	}
	writeJSON(w, http.StatusOK, out)
	s.completed.Add(1)
}

// embeddingInputs splits "input" into its items (each as canonical JSON) and counts its
// tokens; a 400 for anything else than the four shapes OpenAI accepts, or an empty input.
func embeddingInputs(raw json.RawMessage) (items [][]byte, tokens int, bad *badRequest) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, 0, invalid("input", "Missing required parameter: 'input'.")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, 0, invalid("input", "'$.input' is invalid: an empty string.")
		}
		b, _ := json.Marshal(one)
		return [][]byte{b}, len(strings.Fields(one)), nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return nil, 0, invalid("input", "'$.input' is invalid: expected a string, an array of strings, or an array of token arrays.")
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil { // one token array
		b, _ := json.Marshal(ids)
		return [][]byte{b}, len(ids), nil
	}
	for _, el := range list {
		var str string
		var toks []int64
		switch {
		case json.Unmarshal(el, &str) == nil && str != "":
			b, _ := json.Marshal(str)
			items, tokens = append(items, b), tokens+len(strings.Fields(str))
		case json.Unmarshal(el, &toks) == nil && len(toks) > 0:
			b, _ := json.Marshal(toks)
			items, tokens = append(items, b), tokens+len(toks)
		default:
			return nil, 0, invalid("input", "'$.input' is invalid: each item must be a non-empty string or a non-empty token array.")
		}
	}
	return items, tokens, nil
}

// Embedding is the mock's vector of one input (its canonical JSON: a JSON string, or an
// array of token ids) for model, with dims components of unit length.
func Embedding(model string, input []byte, dims int) []float32 {
	h := sha256.New()
	h.Write([]byte(model))
	h.Write([]byte{0})
	h.Write(bytes.TrimSpace(input))
	var seed [40]byte
	copy(seed[:], h.Sum(nil))
	v := make([]float32, dims)
	var block [32]byte
	norm := 0.0
	for i := range v {
		if i%8 == 0 {
			binary.BigEndian.PutUint64(seed[32:], uint64(i/8))
			block = sha256.Sum256(seed[:])
		}
		u := binary.BigEndian.Uint32(block[(i%8)*4:])
		x := float64(u)/float64(math.MaxUint32)*2 - 1
		v[i] = float32(x)
		norm += x * x
	}
	if norm > 0 {
		n := math.Sqrt(norm)
		for i := range v {
			v[i] = float32(float64(v[i]) / n)
		}
	}
	return v
}

// encodeVector is the "embedding" value: a JSON array of numbers, or a base64 string of the
// little-endian float32s.
func encodeVector(v []float32, b64 bool) json.RawMessage {
	if b64 {
		raw := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
		return json.RawMessage(strconv.Quote(base64.StdEncoding.EncodeToString(raw)))
	}
	out := []byte{'['}
	for i, x := range v {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendFloat(out, float64(x), 'g', -1, 32)
	}
	return append(out, ']')
}
