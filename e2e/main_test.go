package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/mockllm"
)

// TestMain fails the package when a goroutine outlives the tests: every gateway the tests
// start must stop completely (NATS server, connections, workers, HTTP server, stream writers).
// The shared test client's idle keep-alive connections are closed before the check, so what
// is left belongs to the code under test. One goroutine is ignored, see leakOptions.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(closeIdleAfter{m}, leakOptions()...)
}

// leakOptions are the goleak options of this package. The one ignored goroutine is
// fasthttp's process-wide clock: fasthttp (under Fiber) starts it with
// serverDateOnce.Do(updateServerDate) (fasthttp@v1.51.0 header.go:2285-2297, server.go:2820)
// the first time any server serves, once per process, and it loops forever by design; it is
// not owned by any gateway and no API stops it.
func leakOptions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")}
}

// closeIdleAfter runs the tests, then closes the shared client's idle connections so their
// read/write loops are gone before goleak looks, and waits (bounded) for the fasthttp
// worker-pool cleaners of stopped servers to end.
type closeIdleAfter struct{ m *testing.M }

func (c closeIdleAfter) Run() int {
	code := c.m.Run()
	removeOncegateBinary()
	httpClient.CloseIdleConnections()
	waitFasthttpCleaners(15 * time.Second)
	return code
}

// fasthttpCleaner is the goroutine fasthttp's worker pool runs per server: Server.Shutdown
// closes its stop channel, but the goroutine only looks at it between sleeps of
// MaxIdleWorkerDuration (10 s by default, and Fiber v2 does not expose the setting), so it
// outlives Gateway.Stop by up to 10 s (fasthttp@v1.51.0 workerpool.go:59-70).
const fasthttpCleaner = "github.com/valyala/fasthttp.(*workerPool).Start.func2"

// waitFasthttpCleaners waits until no fasthttp worker-pool cleaner goroutine is left, at most
// timeout. It ignores nothing: a cleaner still there after timeout is reported by goleak.
func waitFasthttpCleaners(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		if !bytes.Contains(buf, []byte(fasthttpCleaner)) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// builtBinary is the oncegate binary of this test run, built by the first test that needs
// it: the tests that run real processes (split roles, crash, takeover, README) share one
// build instead of one each.
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
		path := filepath.Join(dir, "oncegate")
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

// httpClient is the one HTTP client of this package's tests (loopback only, bounded).
var httpClient = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256},
}

const chatPath = "/v1/chat/completions"

// do sends one request and returns the response with its body read.
func do(t testing.TB, method, url, contentType, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp, b
}

// postChat POSTs a JSON chat completion body to the gateway at base.
func postChat(t testing.TB, base, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	return do(t, http.MethodPost, base+chatPath, "application/json", body, hdr)
}

// chatBody is a chat completion request for model with one user message.
func chatBody(model, msg string, extra string) string {
	m, _ := json.Marshal(msg)
	b := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(m) + `}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// directMock answers body with a fresh in-process mock (no gateway): the mock's deterministic
// output for that request, the reference every gateway answer must equal.
func directMock(t testing.TB, body string) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, chatPath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	mockllm.New(mockllm.Options{Models: []string{"oncegate-mock", "oncegate-mock-slow"}}).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("direct mock: status %d body %s", rec.Code, rec.Body.Bytes())
	}
	return rec.Body.Bytes()
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

func parseCompletion(t testing.TB, b []byte) completion {
	t.Helper()
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("not a chat.completion: %v: %s", err, b)
	}
	if c.Object != "chat.completion" || len(c.Choices) != 1 {
		t.Fatalf("not a one-choice chat.completion: %s", b)
	}
	return c
}

// sseData splits an SSE body into its data payloads, failing on anything but "data: " lines
// separated by blank lines (comments such as ": ping" are skipped).
func sseData(t testing.TB, body []byte) []string {
	t.Helper()
	if !bytes.HasSuffix(body, []byte("\n\n")) {
		t.Fatalf("SSE body does not end with a blank line: %q", tail(body))
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		if strings.HasPrefix(ev, ":") {
			continue
		}
		if !strings.HasPrefix(ev, "data: ") || strings.Contains(ev, "\n") {
			t.Fatalf("malformed SSE event %q", ev)
		}
		out = append(out, strings.TrimPrefix(ev, "data: "))
	}
	return out
}

// streamContent concatenates the content deltas of SSE data payloads (up to [DONE]) and says
// whether [DONE] ended them.
func streamContent(t testing.TB, data []string) (id, content string, done bool) {
	t.Helper()
	for i, d := range data {
		if d == "[DONE]" {
			if i != len(data)-1 {
				t.Fatalf("[DONE] is not the last event")
			}
			return id, content, true
		}
		var ch struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(d), &ch); err != nil {
			t.Fatalf("event %d is not JSON: %v: %s", i, err, d)
		}
		if ch.Object != "chat.completion.chunk" {
			t.Fatalf("event %d is not a chat.completion.chunk: %s", i, d)
		}
		if id == "" {
			id = ch.ID
		}
		for _, c := range ch.Choices {
			content += c.Delta.Content
		}
	}
	return id, content, false
}

func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
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

// assertOpenAIError checks b is an OpenAI error body with a non-empty message and type and,
// when code is not "", that code. It returns the code.
func assertOpenAIError(t testing.TB, resp *http.Response, b []byte, code string) string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
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
