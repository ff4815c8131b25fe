package e2e

// The helpers this package's tests share: one way to send a request and to post a chat
// completion, one reference answer (the mock asked directly), one parser of a completion, one
// of an SSE body (sseEvents; the chat transcript, the job events and the Anthropic events are
// read from its events), one live SSE reader, one status and one job lookup, one upstream the
// resilience tests control, one way to run the binary. Helpers that only one test uses stay
// next to it.
//
// Request helpers never call t.Fatal from a goroutine: send returns a result carrying the
// error; do and postChat, for the test's own goroutine, fail the test on a transport error.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit"
)

const (
	chatPath  = "/v1/chat/completions"
	slowModel = "oncegate-mock-slow" // gatewaykit.Config's second mock: 20 ms per token
)

// pollEvery is how often a testkit.CheckFor condition of this package is tried.
const pollEvery = 10 * time.Millisecond

// inFlight is a testkit.CheckFor condition: mock has n backend calls in flight.
func inFlight(mock *mockllm.Server, n int64) func() error {
	return func() error {
		if got := mock.Stats().InFlight; got != n {
			return fmt.Errorf("%d backend calls in flight, want %d", got, n)
		}
		return nil
	}
}

// ---- requests ----

// httpClient is the one HTTP client of this package's tests (loopback only, bounded). TestMain
// closes its idle connections before looking for leaked goroutines.
var httpClient = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024},
}

// result is one finished HTTP exchange.
type result struct {
	Status     int
	Header     http.Header
	Body       []byte
	Err        error // a transport or read error (Status is 0 when there was no response)
	Start, End time.Time
}

// send sends one request and reads the whole response. A body is sent as application/json
// unless hdr sets Content-Type ("" for none). Safe to call from any goroutine.
func send(method, url, body string, hdr map[string]string) result {
	r := result{Start: time.Now()}
	defer func() { r.End = time.Now() }()
	resp, err := openStream(method, url, body, hdr)
	if err != nil {
		r.Err = err
		return r
	}
	defer resp.Body.Close()
	r.Status, r.Header = resp.StatusCode, resp.Header
	r.Body, r.Err = io.ReadAll(resp.Body)
	r.End = time.Now()
	return r
}

// openStream starts a request and returns the live response (the caller closes its body);
// headers as send sets them.
func openStream(method, url, body string, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if _, set := hdr["Content-Type"]; !set && body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if k == "Content-Type" && v == "" {
			continue
		}
		req.Header.Set(k, v)
	}
	return httpClient.Do(req)
}

// do is send on the test's goroutine: a transport error fails the test.
func do(t testing.TB, method, url, body string, hdr map[string]string) result {
	t.Helper()
	r := send(method, url, body, hdr)
	if r.Err != nil {
		t.Fatalf("%s %s: %v", method, url, r.Err)
	}
	return r
}

// postChat posts a chat completion body to the gateway at base.
func postChat(t testing.TB, base, body string, hdr map[string]string) result {
	t.Helper()
	return do(t, http.MethodPost, base+chatPath, body, hdr)
}

// async runs f in a goroutine; the channel delivers its result.
func async(f func() result) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- f() }()
	return ch
}

// chatBody is a chat completion request for model with one user message; extra is raw JSON
// members (`"stream":true`, mock knobs…).
func chatBody(model, msg string, extra string) string {
	m, _ := json.Marshal(msg)
	b := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(m) + `}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// streamed is the chat body member that makes a request streamed (stream), or none.
func streamed(stream bool) string {
	if stream {
		return `"stream":true`
	}
	return ""
}

// mockBody is a chat body for the default mock model with mock knobs (a JSON object) and
// extra members.
func mockBody(msg, knobs, extra string) string {
	var parts []string
	if knobs != "" {
		parts = append(parts, `"mock":`+knobs)
	}
	if extra != "" {
		parts = append(parts, extra)
	}
	return chatBody(config.MockModel, msg, strings.Join(parts, ","))
}

// ---- answers ----

// expectStatus fails the test unless r is a response with status.
func expectStatus(t testing.TB, r result, status int) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("request failed: %v", r.Err)
	}
	if r.Status != status {
		t.Fatalf("status %d, want %d; body %s", r.Status, status, r.Body)
	}
}

// expect checks status and the Oncegate-Idempotency outcome.
func expect(t testing.TB, r result, status int, outcome string) {
	t.Helper()
	expectStatus(t, r, status)
	if got := r.Header.Get("Oncegate-Idempotency"); got != outcome {
		t.Errorf("Oncegate-Idempotency = %q, want %q", got, outcome)
	}
}

// expectError checks status and an OpenAI error body with a message and, when code is not "",
// that code.
func expectError(t testing.TB, r result, status int, code string) {
	t.Helper()
	expectStatus(t, r, status)
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || (code != "" && e.Error.Code != code) || e.Error.Message == "" {
		t.Errorf("error body %s, want an OpenAI error with code %q", r.Body, code)
	}
}

// openAIError is the OpenAI error body.
type openAIError struct {
	Error *struct {
		Message *string `json:"message"`
		Type    *string `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// assertOpenAIError checks r is a JSON OpenAI error body with every member, a non-empty
// message and type and, when code is not "", that code. It returns the code.
func assertOpenAIError(t testing.TB, r result, code string) string {
	t.Helper()
	b := r.Body
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("error Content-Type = %q, want application/json", ct)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("error body is not a JSON object of objects: %v: %s", err, b)
	}
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][f]; !ok {
			t.Errorf("error body lacks error.%s: %s", f, b)
		}
	}
	var e openAIError
	if err := json.Unmarshal(b, &e); err != nil || e.Error == nil {
		t.Fatalf("not an OpenAI error body: %v: %s", err, b)
	}
	if e.Error.Message == nil || *e.Error.Message == "" {
		t.Errorf("error.message is empty: %s", b)
	}
	if e.Error.Type == nil || *e.Error.Type == "" {
		t.Errorf("error.type is empty: %s", b)
	}
	got := ""
	if e.Error.Code != nil {
		got = *e.Error.Code
	}
	if code != "" && got != code {
		t.Errorf("error.code = %q, want %q: %s", got, code, b)
	}
	return got
}

// attempts is the Oncegate-Attempts header of r.
func attempts(r result) string { return r.Header.Get("Oncegate-Attempts") }

// askMock answers body with a fresh in-process mock (no gateway, no delays, the gateway's
// default 16 tokens), whatever the status: the backend's own answer to that request.
func askMock(body string) (int, []byte) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, chatPath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Mock-TTFT-Ms", "0")
	req.Header.Set("X-Mock-Inter-Token-Ms", "0")
	mockllm.New(mockllm.Options{Models: []string{config.MockModel, slowModel}, Tokens: config.DefaultMockTokens}).ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// directMock is askMock's answer, which must be a 200: the reference every gateway answer to
// body must equal, byte for byte.
func directMock(t testing.TB, body string) []byte {
	t.Helper()
	status, b := askMock(body)
	if status != http.StatusOK {
		t.Fatalf("direct mock: status %d body %s", status, b)
	}
	return b
}

// reference is the backend's non-stream answer (id, content) to body, streamed or not.
func reference(t testing.TB, body string) (id, content string) {
	t.Helper()
	b, err := backend.PrepareBody([]byte(body), false)
	if err != nil {
		t.Fatal(err)
	}
	c := parseCompletion(t, directMock(t, string(b)))
	return c.ID, c.Choices[0].Message.Content
}

// mockContent is the reference answer text of msg to the default mock model.
func mockContent(t testing.TB, msg string) string {
	t.Helper()
	_, content := reference(t, chatBody(config.MockModel, msg, ""))
	return content
}

// completion is the part of a chat.completion the tests read.
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// answerOf reads id and content of a one-choice chat.completion.
func answerOf(b []byte) (id, content string, err error) {
	var c completion
	if err := json.Unmarshal(b, &c); err != nil || c.Object != "chat.completion" || len(c.Choices) != 1 {
		return "", "", fmt.Errorf("not a one-choice chat.completion (%v): %s", err, b)
	}
	return c.ID, c.Choices[0].Message.Content, nil
}

// parseCompletion is the one-choice chat.completion b, or fails the test.
func parseCompletion(t testing.TB, b []byte) completion {
	t.Helper()
	if _, _, err := answerOf(b); err != nil {
		t.Fatal(err)
	}
	var c completion
	_ = json.Unmarshal(b, &c)
	return c
}

// tail is the end of b, for messages.
func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}

// ---- SSE ----

// sseEvent is one SSE event.
type sseEvent struct {
	ID    string
	HasID bool
	Event string // the "event:" name (Anthropic streams)
	Data  string
	Raw   string // the event's block as sent, with its terminating blank line
}

// sseEvents splits an SSE body into events ("id:", "event:" and one "data:" line each;
// comments skipped). Anything else, an event with no data, or a body not ending with a blank
// line, is an error.
func sseEvents(body []byte) ([]sseEvent, error) {
	if len(body) == 0 {
		return nil, nil
	}
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		return nil, fmt.Errorf("SSE body does not end with a blank line: %q", tail(body))
	}
	var out []sseEvent
	for _, block := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		ev := sseEvent{Raw: block + "\n\n"}
		data, fields := false, false
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, ":"):
			case strings.HasPrefix(line, "id: "):
				ev.ID, ev.HasID, fields = strings.TrimPrefix(line, "id: "), true, true
			case strings.HasPrefix(line, "event: "):
				ev.Event, fields = strings.TrimPrefix(line, "event: "), true
			case strings.HasPrefix(line, "data: ") && !data:
				ev.Data, data = strings.TrimPrefix(line, "data: "), true
			default:
				return nil, fmt.Errorf("malformed SSE line %q in %q", line, block)
			}
		}
		if data {
			out = append(out, ev)
		} else if fields {
			return nil, fmt.Errorf("SSE event with no data: %q", block)
		}
	}
	return out, nil
}

// chatStream is a parsed chat completion stream.
type chatStream struct {
	Data    []string // data payloads in order
	ID      string
	Content string
	Done    bool   // ended with [DONE]
	ErrCode string // the code of an error event that ended it
}

// parseChatStream parses a chat completion SSE body: data-only events, chunks, then [DONE]
// or an error event last.
func parseChatStream(body []byte) (chatStream, error) {
	evs, err := sseEvents(body)
	if err != nil {
		return chatStream{}, err
	}
	data := make([]string, len(evs))
	for i, ev := range evs {
		if ev.HasID || ev.Event != "" {
			return chatStream{}, fmt.Errorf("chat stream event %d has an id or a name: %q", i, ev.Raw)
		}
		data[i] = ev.Data
	}
	return chatTranscript(data)
}

// chatStreamOf is parseChatStream of body, or fails the test.
func chatStreamOf(t testing.TB, body []byte) chatStream {
	t.Helper()
	st, err := parseChatStream(body)
	if err != nil {
		t.Fatalf("chat stream: %v: %q", err, tail(body))
	}
	return st
}

// chatTranscript reads the data payloads of a chat completion stream: chunks, then [DONE] or
// an error event last.
func chatTranscript(data []string) (chatStream, error) {
	s := chatStream{Data: data}
	for i, d := range data {
		last := i == len(data)-1
		if d == "[DONE]" {
			if !last {
				return s, errors.New("[DONE] is not the last event")
			}
			s.Done = true
			continue
		}
		var ch struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(d), &ch); err != nil {
			return s, fmt.Errorf("event %d is not JSON: %v: %s", i, err, d)
		}
		if ch.Error != nil {
			if !last {
				return s, fmt.Errorf("error event %d is not the last", i)
			}
			s.ErrCode = ch.Error.Code
			continue
		}
		if ch.Object != "chat.completion.chunk" {
			return s, fmt.Errorf("event %d is not a chat.completion.chunk: %s", i, d)
		}
		if s.ID == "" {
			s.ID = ch.ID
		}
		for _, c := range ch.Choices {
			s.Content += c.Delta.Content
		}
	}
	return s, nil
}

// sseReader reads a live SSE response one event block at a time, keeping every byte read.
type sseReader struct {
	br  *bufio.Reader
	raw bytes.Buffer
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{br: bufio.NewReader(r)} }

// next returns the next event block, including its terminating blank line.
func (r *sseReader) next() ([]byte, error) {
	var ev []byte
	for {
		line, err := r.br.ReadBytes('\n')
		ev = append(ev, line...)
		r.raw.Write(line)
		if err != nil {
			return ev, err
		}
		if len(line) == 1 && len(ev) > 1 {
			return ev, nil
		}
	}
}

// drain reads to the end of the stream and returns every byte read.
func (r *sseReader) drain() []byte {
	for {
		if _, err := r.next(); err != nil {
			return r.raw.Bytes()
		}
	}
}

// sseFrames reads an SSE body in a goroutine and delivers each event's data; the channel is
// closed at the end of the body, and *readErr then holds the read error (nil at a clean EOF
// after a whole event).
func sseFrames(body io.ReadCloser, readErr *error) <-chan string {
	out := make(chan string, 1024)
	go func() {
		defer close(out)
		defer body.Close()
		r := newSSEReader(body)
		for {
			block, err := r.next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					*readErr = err
				} else if len(block) > 0 {
					*readErr = fmt.Errorf("stream ended inside an event: %w", io.ErrUnexpectedEOF)
				}
				return
			}
			evs, err := sseEvents(block)
			if err != nil {
				*readErr = err
				return
			}
			for _, ev := range evs {
				out <- ev.Data
			}
		}
	}()
	return out
}

// ---- the status API ----

// idemStatus is GET /v1/idempotency/{key} as a JSON object (it fails the test on anything but
// 200); hdr carries a tenant's credentials.
func idemStatus(t testing.TB, base, key string, hdr map[string]string) map[string]any {
	t.Helper()
	r := do(t, http.MethodGet, base+"/v1/idempotency/"+url.PathEscape(key), "", hdr)
	if r.Status != http.StatusOK {
		t.Fatalf("GET idempotency %q: %d %s", key, r.Status, r.Body)
	}
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("idempotency status is not JSON: %s", r.Body)
	}
	return m
}

// job is GET /v1/jobs/{id}.
type job struct {
	ID       string          `json:"id"`
	Object   string          `json:"object"`
	Status   string          `json:"status"`
	Epoch    int             `json:"epoch"`
	Attempts int             `json:"attempts"`
	Tokens   int             `json:"tokens_so_far"`
	Result   json.RawMessage `json:"result"`
	Error    json.RawMessage `json:"error"`
}

// getJob is GET /v1/jobs/{id}: the job when the answer is 200, and the exchange.
func getJob(t testing.TB, base, id string) (job, result) {
	t.Helper()
	r := send(http.MethodGet, base+"/v1/jobs/"+id, "", nil)
	var j job
	if r.Status == http.StatusOK {
		if err := json.Unmarshal(r.Body, &j); err != nil {
			t.Fatalf("job %s: %v: %s", id, err, r.Body)
		}
	}
	return j, r
}

// autoKey is the key the gateway derives for a keyless POST of body to path by tenant:
// "auto-" + hex(SHA-256(tenant \0 "auto" \0 method \0 path \0 fingerprint \0)[:16]), the
// fingerprint being the SHA-256 of the body's canonical JSON without stream/stream_options
// (httpapi/keys.go). Tests check it against the key the gateway echoes before relying on it.
func autoKey(tenant, path string, body []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return "", err
	}
	delete(obj, "stream")
	delete(obj, "stream_options")
	canon, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	fp := sha256.Sum256(canon)
	h := sha256.New()
	for _, p := range []string{tenant, "auto", http.MethodPost, path, hex.EncodeToString(fp[:])} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "auto-" + hex.EncodeToString(h.Sum(nil)[:16]), nil
}

// sha is the hex SHA-256 of s (how the config stores API keys).
func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ---- an upstream the resilience tests control ----

// hit is one chat request an upstream received.
type hit struct {
	at     time.Time
	key    string // Idempotency-Key header
	intent string // content of the first message
}

// upstream is an OpenAI-compatible backend on 127.0.0.1 that the tests fully control: it
// records every chat request, lets hook answer it (hook returns false to pass), and otherwise
// serves it with a deterministic mock (whose Stats count real executions).
type upstream struct {
	*httptest.Server
	Mock *mockllm.Server
	hook func(w http.ResponseWriter, r *http.Request, body []byte, h hit) bool

	mu   sync.Mutex
	hits []hit
}

func startUpstream(t testing.TB, hook func(w http.ResponseWriter, r *http.Request, body []byte, h hit) bool) *upstream {
	t.Helper()
	u := &upstream{Mock: mockllm.New(mockllm.Options{Models: []string{config.MockModel, slowModel}}), hook: hook}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

// base is the URL of the OpenAI API base.
func (u *upstream) base() string { return u.URL + "/v1" }

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if r.Method != http.MethodPost || r.URL.Path != chatPath {
		u.Mock.ServeHTTP(w, r)
		return
	}
	var req struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &req)
	h := hit{at: time.Now(), key: r.Header.Get("Idempotency-Key")}
	if len(req.Messages) > 0 {
		h.intent = req.Messages[0].Content
	}
	u.mu.Lock()
	u.hits = append(u.hits, h)
	u.mu.Unlock()
	if u.hook != nil && u.hook(w, r, body, h) {
		return
	}
	u.Mock.ServeHTTP(w, r)
}

// Hits returns the chat requests received so far.
func (u *upstream) Hits() []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.hits)
}

// refuse answers an OpenAI-style error with status (and Retry-After when retryAfter != "").
func refuse(w http.ResponseWriter, status int, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":"upstream refused with %d","type":"server_error","param":null,"code":null}}`+"\n", status)
}

// fastRetryBackend is a backend entry with fast retries (5–20 ms backoff) and a 10 s attempt
// timeout.
func fastRetryBackend(name, typ, baseURL string, models ...string) config.Backend {
	b := config.Backend{Name: name, Type: typ, BaseURL: baseURL, Models: models,
		Timeout: config.Duration(10 * time.Second), RetryBase: config.Duration(5 * time.Millisecond), RetryCap: config.Duration(20 * time.Millisecond)}
	if typ == config.TypeMock {
		b.Mock = config.MockKnobs{Tokens: config.DefaultMockTokens}
	}
	return b
}

// resilienceRow logs one row of the resilience table (faults_test.go says how to print it).
func resilienceRow(t testing.TB, row, fault, executions, outcome string) {
	t.Helper()
	t.Logf("RESILIENCE row %s | %s | %s | %s", row, fault, executions, outcome)
}

// ---- the binary ----

// builtBinary is the oncegate binary of this test run, built by the first test that needs
// it: the tests that run real processes (split roles, crash, takeover, README) share one
// build.
var builtBinary struct {
	once sync.Once
	dir  string // a temporary directory TestMain removes
	path string
	err  error
}

// oncegateBinary returns the path of the oncegate binary, building it on first use.
func oncegateBinary(t testing.TB) string {
	t.Helper()
	builtBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "oncegate-e2e-bin-")
		if err != nil {
			builtBinary.err = err
			return
		}
		builtBinary.dir = dir
		path := dir + "/oncegate"
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", path, "github.com/oncegate/oncegate/cmd/oncegate").CombinedOutput()
		if err != nil {
			builtBinary.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		builtBinary.path = path
	})
	if builtBinary.err != nil {
		t.Fatalf("oncegate binary: %v", builtBinary.err)
	}
	return builtBinary.path
}

// removeOncegateBinary removes the built binary's directory, if a test built it.
func removeOncegateBinary() {
	if builtBinary.dir != "" {
		_ = os.RemoveAll(builtBinary.dir)
	}
}

// proc is one oncegate process of a test.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *testkit.SyncBuffer // stdout and stderr
	done chan struct{}       // closed when the process has exited (err holds Wait's error)
	err  error
}

// waitReady waits up to 30 s for the gateway at base to answer /readyz 200, failing the test
// at once if one of procs (the gateway's process and what it needs) exits.
func waitReady(t *testing.T, base string, procs ...*proc) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		for _, p := range procs {
			if p.exited() {
				t.Fatalf("%s exited: %v", p.name, p.err)
			}
		}
		return testkit.Ready(httpClient, base)
	})
}

// waitNATSListening waits until p, a process started with --nats-listen addr, has its embedded
// NATS accepting connections there (failing the test if p exits first).
func waitNATSListening(t *testing.T, p *proc, addr string) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if p.exited() {
			t.Fatalf("%s exited early: %v", p.name, p.err)
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return fmt.Errorf("the %s's embedded NATS does not listen on %s: %w", p.name, addr, err)
		}
		return c.Close()
	})
}

// startProc runs bin with args, a clean environment (no ONCEGATE_* or OPENAI_* from the
// caller), and its log in a buffer that is printed if the test fails. When the test ends a
// process still running gets SIGTERM and, 20 s later, SIGKILL.
func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, bin, args...)
}

// startProcEnv is startProc with env added to the clean environment.
func startProcEnv(t *testing.T, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, log: &testkit.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(20 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.log.String())
		}
	})
	return p
}

// sigterm sends SIGTERM and returns the exit code, failing if the process takes longer than
// timeout to exit.
func (p *proc) sigterm(t *testing.T, timeout time.Duration) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s of SIGTERM", p.name, timeout)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("%s: %v", p.name, p.err)
	}
	return 0
}

// kill sends SIGKILL and waits for the process to exit.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL %s: %v", p.name, err)
	}
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
