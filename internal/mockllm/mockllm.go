// Package mockllm is oncegate's deterministic mock model backend. It speaks
// the OpenAI Chat Completions API (streaming and non-streaming) over
// net/http and is used in three ways:
//
//   - in-process, as the built-in backend when no provider is configured
//     (see [Server.RoundTripper], which needs no network listener);
//   - standalone, by "oncegate mock --listen ADDR", for benchmarks;
//   - in tests, to script faults and to count backend executions
//     (see [Server.Stats]).
//
// # Determinism
//
// The generated text depends only on the request: the model and the
// canonical JSON of "messages" are hashed with SHA-256 and the hash stream
// picks words from a fixed 64-word list. The same request always yields the
// same bytes (id, created, content, usage); max_tokens and
// max_completion_tokens only cut the output short (the shorter output is a
// prefix of the longer one), and "n" is ignored.
//
// # Routes
//
//	POST /v1/chat/completions   chat completion (JSON or SSE when "stream": true)
//	POST /v1/messages           Anthropic Messages (anthropic.go)
//	POST /v1/embeddings         embeddings, deterministic vectors (embeddings.go)
//	POST /v1beta/models/{m}:generateContent, :streamGenerateContent?alt=sse
//	                            Google Gemini (gemini.go)
//	POST /openai/deployments/{d}/chat/completions?api-version=…
//	                            Azure OpenAI (azure.go)
//	POST /model/{id}/converse, /model/{id}/converse-stream
//	                            Amazon Bedrock's Converse API, SigV4 and the binary
//	                            event stream (bedrock.go)
//	GET  /v1/models             OpenAI model list
//	GET  /v1/models/{model}     one model object
//	GET  /stats                 Stats as JSON
//	POST /stats/reset           zero the counters, returns the new Stats
//
// Any other path answers 404 with an OpenAI-style JSON error.
//
// # Timing
//
// Nothing is sent before TTFT has elapsed. In stream mode the role chunk
// and the first token are written at TTFT and every further token follows
// InterToken after the previous one. In non-stream mode the whole body is
// written after TTFT + tokens*InterToken. All waits end early when the
// request context is cancelled.
//
// # Per-request knobs and faults
//
// A request may override Options and inject a fault either with a "mock"
// object in the request body,
//
//	"mock": {"ttft_ms": 50, "inter_token_ms": 5, "tokens": 8,
//	         "fault": "drop_after", "fault_after": 3, "retry_after": "2",
//	         "fault_first_n": 1}
//
// or with the headers X-Mock-TTFT-Ms, X-Mock-Inter-Token-Ms, X-Mock-Tokens,
// X-Mock-Fault, X-Mock-Fault-After, X-Mock-Retry-After and
// X-Mock-Fault-First-N. A header wins over the corresponding body field.
// Faults:
//
//	error_400, error_401, error_403,
//	error_404, error_422,
//	error_500, error_502,
//	error_503, error_504  that status with an OpenAI error body (after TTFT)
//	rate_limit            429 with Retry-After (retry_after, default "1") and retry-after-ms
//	stall                 read the request, then send nothing until the request context ends
//	drop_after            stream: abort the connection after fault_after token chunks;
//	                      non-stream: abort after half of the body
//	error_event_after     stream: after fault_after token chunks, the API's in-stream error
//	                      event, then a clean end: Chat Completions (and Azure)
//	                      data: {"error":{"message":"mock in-stream error",…}} then
//	                      data: [DONE], as vLLM sends it; Messages event: error with
//	                      {"type":"error","error":{"type":"overloaded_error",
//	                      "message":"Overloaded"}} then the end of the body, as Anthropic
//	                      sends it; Gemini its error object, Bedrock a
//	                      modelStreamErrorException message, then the end. Non-stream:
//	                      answered normally (no fault)
//	drop_start            send the status line and headers (200), then abort the
//	                      connection before any event or body byte
//	slow_drip             normal response, but 200ms between tokens unless inter_token_ms is set
//	lost_response         generate the whole answer (it takes as long as a normal one and
//	                      counts as Completed), then abort the connection before writing
//	                      any response byte: "completed, but the response was lost"
//
// fault_first_n N limits the fault to the first N requests of its fault
// scope, counted per Server; later requests of the scope are answered
// normally (a 5xx burst, "429 then OK", a stream that breaks once). The
// scope is the seed of the answer (SHA-256 of the canonical messages and the
// model; knobs are not part of it), so a continuation (below) is in the scope
// of the request it continues. Reset forgets the scopes.
//
// Every chat completion request increments Stats.Requests and every injected
// fault increments Stats.Faults. An aborted response is reported to a
// net/http client as a read error (unexpected EOF), never as a clean EOF.
//
// # Continuation (vLLM continue_final_message)
//
// A request with "continue_final_message": true and "add_generation_prompt":
// false whose last message is {"role": "assistant", "content": P} (a string)
// continues P the way vLLM does: the answer is generated for the
// conversation without that last message (same seed, same tokens as the
// original request, max_tokens bounding the whole answer as it did there)
// and, if P is a prefix of that answer's text, only the rest is sent; a P
// that ends inside a token gets the rest of that token first. Usage counts
// only the new tokens as completion_tokens (prompt_tokens include P). A P that
// is not a prefix of the answer, a last message that is not such an assistant
// message, or continue_final_message without add_generation_prompt: false is
// a 400.
//
// # Assistant prefill (Anthropic Messages)
//
// On POST /v1/messages, a last message with role "assistant" (string content or text
// blocks) is a prefill, as Anthropic reads it: the answer is the same conversation's answer
// continued after that text, and its content holds only what follows (the continuation
// above, so the same prefix rule and fault scope apply). A prefill ending in whitespace is a
// 400, as it is at Anthropic.
package mockllm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncegate/oncegate/internal/clock"
)

const (
	defaultModel     = "oncegate-mock"
	defaultTokens    = 16
	fixedCreated     = 1700000000
	fingerprint      = "fp_oncegate_mock"
	idPrefix         = "chatcmpl-mock-"
	slowDripInterval = 200 * time.Millisecond
	maxBodyBytes     = 32 << 20
	maxTokensKnob    = 1 << 20
	maxDelayMs       = 24 * 60 * 60 * 1000 // knob delays are capped at one day
)

// words is the fixed vocabulary; the hash stream picks one word per byte
// (low 6 bits), so it must hold exactly 64 distinct words.
var words = [...]string{
	"the", "of", "and", "to", "in", "is", "that", "for",
	"it", "as", "was", "with", "be", "by", "on", "not",
	"he", "this", "are", "or", "his", "from", "at", "which",
	"but", "have", "an", "had", "they", "you", "were", "their",
	"one", "all", "we", "can", "her", "has", "there", "been",
	"if", "more", "when", "will", "would", "who", "so", "no",
	"time", "people", "about", "out", "up", "what", "some", "into",
	"only", "new", "other", "could", "like", "then", "now", "day",
}

// Compile-time check that words has exactly 64 entries.
var _ = [1]struct{}{}[len(words)-64]

// Options configures a Server. The zero value is usable.
type Options struct {
	TTFT       time.Duration // delay before the first byte of the response (stream and non-stream)
	InterToken time.Duration // delay between tokens (stream); non-stream waits TTFT + tokens*InterToken total
	Tokens     int           // output tokens, default 16 when 0
	Models     []string      // served model names; default ["oncegate-mock"]
	// AWSSecretKey, when set, makes the Bedrock routes check each request's SigV4 signature
	// with it (bedrock.go); empty, they only require one.
	AWSSecretKey string
}

// Stats are the Server's counters.
type Stats struct {
	Requests  int64 `json:"requests"`  // chat, messages and embeddings requests received (any outcome) = backend executions
	Completed int64 `json:"completed"` // successful chat completion responses fully written
	InFlight  int64 `json:"in_flight"` // chat completion requests being handled now
	Faults    int64 `json:"faults"`    // injected faults
}

// Server is the mock backend. It implements http.Handler and is safe for
// concurrent use.
type Server struct {
	opts   Options
	models []string
	known  map[string]bool

	requests  atomic.Int64
	completed atomic.Int64
	inFlight  atomic.Int64
	faults    atomic.Int64

	scopeMu sync.Mutex
	scopes  map[[32]byte]int64 // fault_first_n: requests seen per fault scope
}

// New returns a Server configured by opts.
func New(opts Options) *Server {
	s := &Server{opts: opts, known: make(map[string]bool)}
	for _, m := range opts.Models {
		if m != "" && !s.known[m] {
			s.known[m] = true
			s.models = append(s.models, m)
		}
	}
	if len(s.models) == 0 {
		s.models = []string{defaultModel}
		s.known[defaultModel] = true
	}
	s.opts.Models = s.models
	return s
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:  s.requests.Load(),
		Completed: s.completed.Load(),
		InFlight:  s.inFlight.Load(),
		Faults:    s.faults.Load(),
	}
}

// Reset zeroes the Requests, Completed and Faults counters and forgets the
// fault_first_n scopes. InFlight is a gauge of running handlers and is left
// alone, so it stays accurate.
func (s *Server) Reset() {
	s.requests.Store(0)
	s.completed.Store(0)
	s.faults.Store(0)
	s.scopeMu.Lock()
	s.scopes = nil
	s.scopeMu.Unlock()
}

// ServeHTTP routes the request (see the package documentation).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/v1/chat/completions":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.serveChat(w, r)
	case path == "/v1/messages":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.serveMessages(w, r)
	case strings.HasPrefix(path, "/v1beta/models/"):
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.serveGemini(w, r)
	case strings.HasPrefix(path, "/openai/deployments/"):
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.serveAzure(w, r)
	case strings.HasPrefix(path, "/model/"):
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.serveBedrock(w, r)
	case path == "/v1/embeddings":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.serveEmbeddings(w, r)
	case path == "/v1/models":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, r, http.MethodGet)
			return
		}
		list := modelList{Object: "list", Data: make([]modelObject, 0, len(s.models))}
		for _, m := range s.models {
			list.Data = append(list.Data, newModelObject(m))
		}
		writeJSON(w, http.StatusOK, list)
	case strings.HasPrefix(path, "/v1/models/"):
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, r, http.MethodGet)
			return
		}
		id := strings.TrimPrefix(path, "/v1/models/")
		if !s.known[id] {
			writeModelNotFound(w, id)
			return
		}
		writeJSON(w, http.StatusOK, newModelObject(id))
	case path == "/stats":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, r, http.MethodGet)
			return
		}
		writeJSON(w, http.StatusOK, s.Stats())
	case path == "/stats/reset":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return
		}
		s.Reset()
		writeJSON(w, http.StatusOK, s.Stats())
	default:
		writeError(w, http.StatusNotFound, apiError{
			Message: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, path),
			Type:    "invalid_request_error",
			Code:    strPtr("unknown_url"),
		})
	}
}

// ---- wire types (field order is the byte order on the wire) ----

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func newModelObject(id string) modelObject {
	return modelObject{ID: id, Object: "model", Created: fixedCreated, OwnedBy: "oncegate"}
}

type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type errorBody struct {
	Error apiError `json:"error"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	Usage             usage              `json:"usage"`
}

type completionChoice struct {
	Index        int               `json:"index"`
	Message      completionMessage `json:"message"`
	Logprobs     *struct{}         `json:"logprobs"`
	FinishReason string            `json:"finish_reason"`
}

type completionMessage struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"`
}

type chunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	Logprobs     *struct{}  `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type chunkDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ---- request ----

type chatRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	ContinueFinalMessage *bool      `json:"continue_final_message"`
	AddGenerationPrompt  *bool      `json:"add_generation_prompt"`
	Mock                 *mockKnobs `json:"mock"`
}

type mockKnobs struct {
	TTFTMs       *int64          `json:"ttft_ms"`
	InterTokenMs *int64          `json:"inter_token_ms"`
	Tokens       *int64          `json:"tokens"`
	Fault        string          `json:"fault"`
	FaultAfter   *int64          `json:"fault_after"`
	FaultFirstN  *int64          `json:"fault_first_n"`
	RetryAfter   json.RawMessage `json:"retry_after"` // string or number
}

// plan is everything a chat request resolves to before output starts.
type plan struct {
	model        string
	seed         [32]byte
	promptTokens int
	tokens       int      // tokens of the whole answer
	out          []string // tokens to emit: the whole answer, or the rest of a continuation
	finish       string   // "stop" or "length"
	stream       bool
	includeUsage bool
	ttft         time.Duration
	interToken   time.Duration
	fault        string
	faultAfter   int
	retryAfter   string
}

// badRequest is a validation failure answered with a 400 (or the status in
// it) OpenAI error.
type badRequest struct {
	status int
	err    apiError
}

func invalid(param, format string, args ...any) *badRequest {
	e := apiError{Message: fmt.Sprintf(format, args...), Type: "invalid_request_error"}
	if param != "" {
		e.Param = strPtr(param)
	}
	return &badRequest{status: http.StatusBadRequest, err: e}
}

func (s *Server) serveChat(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)

	body, err := readBody(w, r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, apiError{
				Message: fmt.Sprintf("Request body too large (limit %d bytes).", mbe.Limit),
				Type:    "invalid_request_error",
			})
			return
		}
		if r.Context().Err() == nil {
			writeError(w, http.StatusBadRequest, apiError{
				Message: "Could not read the request body: " + err.Error(),
				Type:    "invalid_request_error",
			})
		}
		return
	}
	p, bad := s.resolve(r, body)
	if bad != nil {
		writeError(w, bad.status, bad.err)
		return
	}

	ctx := r.Context()
	switch p.fault {
	case "":
	case "error_400", "error_401", "error_403", "error_404", "error_422",
		"error_500", "error_502", "error_503", "error_504", "rate_limit":
		s.faults.Add(1)
		if !clock.Sleep(ctx, p.ttft) {
			return
		}
		writeFault(w, p)
		return
	case "stall":
		s.faults.Add(1)
		<-ctx.Done()
		return
	case "lost_response":
		s.faults.Add(1)
		if !clock.Sleep(ctx, p.generationTime()) {
			return
		}
		s.completed.Add(1) // the answer exists; nobody will ever read it
		panic(http.ErrAbortHandler)
	case "drop_after", "drop_start", "slow_drip":
		s.faults.Add(1)
	case "error_event_after":
		if p.stream { // a non-stream answer has no in-stream error: answered normally
			s.faults.Add(1)
		}
	}

	var ok bool
	if p.stream {
		ok = s.writeStream(w, r, p)
	} else {
		ok = s.writeNonStream(w, r, p)
	}
	if ok {
		s.completed.Add(1)
	}
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	return buf.Bytes(), err
}

// resolve validates the request and computes its plan.
func (s *Server) resolve(r *http.Request, body []byte) (*plan, *badRequest) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, invalid("", "We could not parse the JSON body of your request. (mock: %v)", err)
	}
	if len(req.Messages) == 0 || string(req.Messages) == "null" {
		return nil, invalid("messages", "Missing required parameter: 'messages'.")
	}
	dec := json.NewDecoder(bytes.NewReader(req.Messages))
	dec.UseNumber()
	var msgs any
	if err := dec.Decode(&msgs); err != nil {
		return nil, invalid("messages", "Invalid 'messages': %v.", err)
	}
	list, isList := msgs.([]any)
	if !isList {
		return nil, invalid("messages", "Invalid type for 'messages': expected an array.")
	}
	if len(list) == 0 {
		return nil, invalid("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.")
	}
	for i, m := range list {
		if _, isObj := m.(map[string]any); !isObj {
			return nil, invalid(fmt.Sprintf("messages.[%d]", i), "Invalid type for 'messages.[%d]': expected an object.", i)
		}
	}
	if req.Model == "" {
		return nil, invalid("model", "you must provide a model parameter")
	}
	if !s.known[req.Model] {
		return nil, &badRequest{status: http.StatusNotFound, err: modelNotFound(req.Model)}
	}

	seedList := list
	var prefix *string
	if req.ContinueFinalMessage != nil && *req.ContinueFinalMessage {
		var bad *badRequest
		if prefix, bad = continuationPrefix(list, req.AddGenerationPrompt); bad != nil {
			return nil, bad
		}
		seedList = list[:len(list)-1]
	}

	// Canonical JSON: maps marshal with sorted keys, numbers keep their
	// literal text, insignificant whitespace is gone.
	canonical, err := json.Marshal(seedList)
	if err != nil {
		return nil, invalid("messages", "Invalid 'messages': %v.", err)
	}
	h := sha256.New()
	h.Write(canonical)
	h.Write([]byte{0})
	h.Write([]byte(req.Model))

	p := &plan{
		model:        req.Model,
		promptTokens: countPromptTokens(list),
		stream:       req.Stream,
		includeUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		ttft:         s.opts.TTFT,
		interToken:   s.opts.InterToken,
		tokens:       s.opts.Tokens,
		retryAfter:   "1",
	}
	copy(p.seed[:], h.Sum(nil))
	if p.tokens <= 0 {
		p.tokens = defaultTokens
	}
	if p.ttft < 0 {
		p.ttft = 0
	}
	if p.interToken < 0 {
		p.interToken = 0
	}

	// Knobs: body first, headers override.
	k := req.Mock
	if k == nil {
		k = &mockKnobs{}
	}
	var retryAfter string
	if len(k.RetryAfter) > 0 && string(k.RetryAfter) != "null" {
		var str string
		var num json.Number
		switch {
		case json.Unmarshal(k.RetryAfter, &str) == nil:
			retryAfter = str
		case json.Unmarshal(k.RetryAfter, &num) == nil:
			retryAfter = num.String()
		default:
			return nil, invalid("mock.retry_after", "Invalid 'mock.retry_after': expected a string or a number.")
		}
	}
	hdr := r.Header
	var bad *badRequest
	intKnob := func(dst **int64, header, param string, max int64) {
		if bad != nil {
			return
		}
		if v := hdr.Get(header); v != "" {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				bad = invalid(header, "Invalid header %s: %q is not an integer.", header, v)
				return
			}
			*dst = &n
		}
		if *dst != nil && (**dst < 0 || **dst > max) {
			bad = invalid(param, "Invalid %s: %d is out of range [0, %d].", param, **dst, max)
		}
	}
	intKnob(&k.TTFTMs, "X-Mock-TTFT-Ms", "mock.ttft_ms", maxDelayMs)
	intKnob(&k.InterTokenMs, "X-Mock-Inter-Token-Ms", "mock.inter_token_ms", maxDelayMs)
	intKnob(&k.Tokens, "X-Mock-Tokens", "mock.tokens", maxTokensKnob)
	intKnob(&k.FaultAfter, "X-Mock-Fault-After", "mock.fault_after", math.MaxInt32)
	intKnob(&k.FaultFirstN, "X-Mock-Fault-First-N", "mock.fault_first_n", math.MaxInt32)
	if bad != nil {
		return nil, bad
	}
	if v := hdr.Get("X-Mock-Fault"); v != "" {
		k.Fault = strings.TrimSpace(v)
	}
	if v := hdr.Get("X-Mock-Retry-After"); v != "" {
		retryAfter = strings.TrimSpace(v)
	}

	if k.TTFTMs != nil {
		p.ttft = time.Duration(*k.TTFTMs) * time.Millisecond
	}
	if k.InterTokenMs != nil {
		p.interToken = time.Duration(*k.InterTokenMs) * time.Millisecond
	}
	if k.Tokens != nil {
		p.tokens = int(*k.Tokens)
	}
	if k.FaultAfter != nil {
		p.faultAfter = int(*k.FaultAfter)
	}
	if retryAfter != "" {
		p.retryAfter = retryAfter
	}
	switch k.Fault {
	case "", "none":
	case "error_400", "error_401", "error_403", "error_404", "error_422",
		"error_500", "error_502", "error_503", "error_504",
		"rate_limit", "stall", "drop_after", "drop_start", "slow_drip", "lost_response", "error_event_after":
		p.fault = k.Fault
	default:
		return nil, invalid("mock.fault", "Unknown mock fault %q.", k.Fault)
	}

	// Output length: the configured count, cut by max_tokens /
	// max_completion_tokens (the smaller one when both are set).
	p.finish = "stop"
	for _, lim := range []struct {
		v    *int64
		name string
	}{{req.MaxTokens, "max_tokens"}, {req.MaxCompletionTokens, "max_completion_tokens"}} {
		if lim.v == nil {
			continue
		}
		if *lim.v < 1 {
			return nil, invalid(lim.name, "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", lim.name, *lim.v)
		}
		if *lim.v < int64(p.tokens) {
			p.tokens = int(*lim.v)
			p.finish = "length"
		}
	}

	p.out = genTokens(p.seed, p.tokens)
	if prefix != nil {
		rest, ok := continueAfter(p.out, *prefix)
		if !ok {
			return nil, invalid("messages", "mock: the final assistant message is not a prefix of this conversation's answer, so it cannot be continued.")
		}
		p.out = rest
	}

	// Decided last, once the request is valid: only requests that run count
	// towards fault_first_n.
	if p.fault != "" && k.FaultFirstN != nil && s.countScope(p.seed) > *k.FaultFirstN {
		p.fault = ""
	}
	if p.fault == "slow_drip" && k.InterTokenMs == nil {
		p.interToken = slowDripInterval
	}
	return p, nil
}

// countScope counts one more request of a fault scope and returns the count.
func (s *Server) countScope(scope [32]byte) int64 {
	s.scopeMu.Lock()
	defer s.scopeMu.Unlock()
	if s.scopes == nil {
		s.scopes = make(map[[32]byte]int64)
	}
	s.scopes[scope]++
	return s.scopes[scope]
}

// continuationPrefix checks a continue_final_message request the way vLLM
// does and returns the text of the final assistant message.
func continuationPrefix(list []any, addGenerationPrompt *bool) (*string, *badRequest) {
	if addGenerationPrompt == nil || *addGenerationPrompt {
		return nil, invalid("add_generation_prompt", "Cannot set both `continue_final_message` and `add_generation_prompt` to True (add_generation_prompt defaults to True).")
	}
	last := list[len(list)-1].(map[string]any)
	content, isString := last["content"].(string)
	if role, _ := last["role"].(string); role != "assistant" || !isString {
		return nil, invalid("messages", "`continue_final_message` requires the final message to be an assistant message with string content.")
	}
	return &content, nil
}

// continueAfter returns the tokens of the answer toks that follow the text
// prefix; a prefix ending inside a token yields the rest of that token first.
func continueAfter(toks []string, prefix string) ([]string, bool) {
	if !strings.HasPrefix(strings.Join(toks, ""), prefix) {
		return nil, false
	}
	n := 0
	for i, tok := range toks {
		switch {
		case n+len(tok) <= len(prefix):
			n += len(tok)
		case n == len(prefix):
			return toks[i:], true
		default:
			return append([]string{tok[len(prefix)-n:]}, toks[i+1:]...), true
		}
	}
	return []string{}, true
}

// countPromptTokens counts whitespace-separated words across all message
// contents: string contents, and the text parts of array contents.
func countPromptTokens(msgs []any) int {
	n := 0
	for _, m := range msgs {
		switch c := m.(map[string]any)["content"].(type) {
		case string:
			n += len(strings.Fields(c))
		case []any:
			for _, part := range c {
				pm, ok := part.(map[string]any)
				if !ok {
					continue
				}
				if t, _ := pm["type"].(string); t != "text" {
					continue
				}
				if text, ok := pm["text"].(string); ok {
					n += len(strings.Fields(text))
				}
			}
		}
	}
	return n
}

// tokens returns the first n output tokens for the seed: block k of the hash
// stream is SHA-256(seed || uint64be(k)) and each byte picks a word.
func genTokens(seed [32]byte, n int) []string {
	out := make([]string, 0, n)
	var in [40]byte
	copy(in[:], seed[:])
	for k := uint64(0); len(out) < n; k++ {
		binary.BigEndian.PutUint64(in[32:], k)
		block := sha256.Sum256(in[:])
		for _, b := range block {
			if len(out) == n {
				break
			}
			w := words[b&63]
			if len(out) > 0 {
				w = " " + w
			}
			out = append(out, w)
		}
	}
	return out
}

func (p *plan) id() string {
	return idPrefix + hex.EncodeToString(p.seed[:])[:24]
}

func (p *plan) usage() usage {
	n := len(p.out)
	return usage{PromptTokens: p.promptTokens, CompletionTokens: n, TotalTokens: p.promptTokens + n}
}

// generationTime is how long a non-stream answer takes: TTFT + tokens*InterToken.
func (p *plan) generationTime() time.Duration {
	delay, n := p.ttft, time.Duration(len(p.out))
	if n > 0 && p.interToken > 0 {
		if p.interToken > (math.MaxInt64-delay)/n {
			return math.MaxInt64 // saturate instead of overflowing
		}
		delay += n * p.interToken
	}
	return delay
}

// writeNonStream writes the chat.completion object. It reports whether the
// full body was written.
func (s *Server) writeNonStream(w http.ResponseWriter, r *http.Request, p *plan) bool {
	obj := completion{
		ID:                p.id(),
		Object:            "chat.completion",
		Created:           fixedCreated,
		Model:             p.model,
		SystemFingerprint: fingerprint,
		Choices: []completionChoice{{
			Index:        0,
			Message:      completionMessage{Role: "assistant", Content: strings.Join(p.out, "")},
			FinishReason: p.finish,
		}},
		Usage: p.usage(),
	}
	body := marshalLine(obj)
	if !clock.Sleep(r.Context(), p.generationTime()) {
		return false
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if p.fault == "drop_start" {
		_ = flush(w)
		panic(http.ErrAbortHandler)
	}
	if p.fault == "drop_after" {
		_, _ = w.Write(body[:len(body)/2])
		_ = flush(w)
		panic(http.ErrAbortHandler)
	}
	if _, err := w.Write(body); err != nil {
		return false
	}
	return flush(w) == nil
}

// writeStream writes the SSE stream. It reports whether the whole stream,
// including "data: [DONE]", was written.
func (s *Server) writeStream(w http.ResponseWriter, r *http.Request, p *plan) bool {
	ctx := r.Context()
	if !clock.Sleep(ctx, p.ttft) {
		return false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if p.fault == "drop_start" {
		_ = flush(w)
		panic(http.ErrAbortHandler) // the status line and headers went out, no event did
	}

	var usageField json.RawMessage
	if p.includeUsage {
		usageField = json.RawMessage("null")
	}
	id := p.id()
	mk := func(delta chunkDelta, finish *string) chunk {
		return chunk{
			ID:                id,
			Object:            "chat.completion.chunk",
			Created:           fixedCreated,
			Model:             p.model,
			SystemFingerprint: fingerprint,
			Choices:           []chunkChoice{{Index: 0, Delta: delta, FinishReason: finish}},
			Usage:             usageField,
		}
	}
	send := func(v any) bool {
		frame := append(append([]byte("data: "), marshal(v)...), '\n', '\n')
		if _, err := w.Write(frame); err != nil {
			return false
		}
		return flush(w) == nil
	}
	drop := p.fault == "drop_after"
	errorEvent := p.fault == "error_event_after"
	// failed ends the stream cleanly after the in-stream error; the answer is not complete.
	failed := func() bool {
		if send(inStreamError) {
			_, _ = w.Write([]byte("data: [DONE]\n\n"))
			_ = flush(w)
		}
		return false
	}

	empty := ""
	if !send(mk(chunkDelta{Role: "assistant", Content: &empty}, nil)) {
		return false
	}
	for i, tok := range p.out {
		if drop && i == p.faultAfter {
			panic(http.ErrAbortHandler)
		}
		if errorEvent && i == p.faultAfter {
			return failed()
		}
		if i > 0 && !clock.Sleep(ctx, p.interToken) {
			return false
		}
		if !send(mk(chunkDelta{Content: &tok}, nil)) {
			return false
		}
	}
	if drop {
		// fault_after >= tokens: every token went out, the end never does.
		panic(http.ErrAbortHandler)
	}
	if errorEvent {
		return failed() // fault_after >= tokens: every token went out, then the error
	}
	finish := p.finish
	if !send(mk(chunkDelta{}, &finish)) {
		return false
	}
	if p.includeUsage {
		u := marshal(p.usage())
		c := mk(chunkDelta{}, nil)
		c.Choices = []chunkChoice{}
		c.Usage = u
		if !send(c) {
			return false
		}
	}
	if _, err := w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return false
	}
	return flush(w) == nil
}

// inStreamError is fault error_event_after's chunk in a Chat Completions stream, as vLLM
// sends an error that happens while it streams.
var inStreamError = errorBody{Error: apiError{Message: "mock in-stream error", Type: "server_error"}}

// isInStreamError reports whether a chunk of the chat mock's own stream is inStreamError (for
// the translations of the stream into other APIs).
func isInStreamError(data []byte) bool { return bytes.HasPrefix(data, []byte(`{"error":`)) }

func writeFault(w http.ResponseWriter, p *plan) {
	switch p.fault {
	case "rate_limit":
		h := w.Header()
		h.Set("Retry-After", p.retryAfter)
		if secs, err := strconv.ParseFloat(p.retryAfter, 64); err == nil && secs >= 0 && !math.IsInf(secs, 0) {
			h.Set("Retry-After-Ms", strconv.FormatInt(int64(math.Round(secs*1000)), 10))
		}
		writeError(w, http.StatusTooManyRequests, apiError{
			Message: "mock: injected rate_limit. Rate limit reached; please try again in " + p.retryAfter + "s.",
			Type:    "requests",
			Code:    strPtr("rate_limit_exceeded"),
		})
	case "error_400":
		writeError(w, http.StatusBadRequest, apiError{Message: "mock: injected 400", Type: "invalid_request_error"})
	case "error_401":
		writeError(w, http.StatusUnauthorized, apiError{
			Message: "mock: injected 401",
			Type:    "invalid_request_error",
			Code:    strPtr("invalid_api_key"),
		})
	case "error_403":
		writeError(w, http.StatusForbidden, apiError{Message: "mock: injected 403", Type: "invalid_request_error", Code: strPtr("permission_denied")})
	case "error_404":
		writeError(w, http.StatusNotFound, apiError{Message: "mock: injected 404", Type: "invalid_request_error", Code: strPtr("not_found")})
	case "error_422":
		writeError(w, http.StatusUnprocessableEntity, apiError{Message: "mock: injected 422", Type: "invalid_request_error"})
	default: // error_5xx
		code, _ := strconv.Atoi(strings.TrimPrefix(p.fault, "error_"))
		writeError(w, code, apiError{Message: fmt.Sprintf("mock: injected %d", code), Type: "server_error"})
	}
}

// ---- helpers ----

func modelNotFound(model string) apiError {
	return apiError{
		Message: fmt.Sprintf("The model `%s` does not exist", model),
		Type:    "invalid_request_error",
		Param:   strPtr("model"),
		Code:    strPtr("model_not_found"),
	}
}

func writeModelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, modelNotFound(model))
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, apiError{
		Message: fmt.Sprintf("Method %s is not allowed for %s; use %s.", r.Method, r.URL.Path, allow),
		Type:    "invalid_request_error",
		Code:    strPtr("method_not_supported"),
	})
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	writeJSON(w, status, errorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body := marshalLine(v)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body) // #nosec G705 -- the mock backend's JSON body, served as application/json
}

// marshal encodes the wire types, which cannot fail to marshal.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("mockllm: marshal: " + err.Error())
	}
	return b
}

func marshalLine(v any) []byte { return append(marshal(v), '\n') }

// flush flushes w if it can; a writer that cannot flush is not an error.
func flush(w http.ResponseWriter) error {
	err := http.NewResponseController(w).Flush()
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}

func strPtr(s string) *string { return &s }
