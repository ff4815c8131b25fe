package openai_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
)

// TestPrepare: the body goes to /chat/completions with "stream" set for the execution and,
// on a stream only, stream_options.include_usage; a body that already fits is sent as it is,
// every other member kept; the client's kept headers go along, the key as Bearer.
func TestPrepare(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		stream bool
		golden string // "": the body goes as it is
		bad    bool
	}{
		{"non-stream as sent", `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.2}`, false, "", false},
		{"stream with usage as sent", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, true, "", false},
		{"stream added", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1}`, true, "prepare-stream-added.golden", false},
		{"usage added to a stream", `{"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":false}}`, true, "prepare-usage-added.golden", false},
		{"stream options dropped without a stream", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, false, "prepare-non-stream.golden", false},
		{"not JSON", `{"model":`, true, "", true},
	}
	header := http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up, err := openai.New().Prepare(dialect.Request{API: dialect.APIOpenAI, Model: "m", Body: []byte(tt.body), Stream: tt.stream, Header: header}, config.Backend{})
			if tt.bad {
				if err == nil {
					t.Fatalf("Prepare(%s) = %s, want an error", tt.body, up.Body)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if up.Path != "/chat/completions" || up.KeyHeader != "" || up.Header.Get("Traceparent") != header.Get("Traceparent") {
				t.Errorf("upstream %s, key header %q, headers %v", up.Path, up.KeyHeader, up.Header)
			}
			if tt.golden == "" {
				if string(up.Body) != tt.body {
					t.Errorf("body %s\nwant it as sent: %s", up.Body, tt.body)
				}
				return
			}
			testkit.Golden(t, "testdata/"+tt.golden, up.Body)
		})
	}
}

const (
	roleChunk    = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	helChunk     = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`
	loChunk      = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}`
	finishChunk  = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
	usageChunk   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	contRole     = `{"id":"chatcmpl-2","object":"chat.completion.chunk","created":200,"model":"m-0613","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`
	contContent  = `{"id":"chatcmpl-2","object":"chat.completion.chunk","created":200,"model":"m-0613","choices":[{"index":0,"delta":{"content":", world"},"finish_reason":null}]}`
	contFinish   = `{"id":"chatcmpl-2","object":"chat.completion.chunk","created":200,"model":"m-0613","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
	contUsage    = `{"id":"chatcmpl-2","object":"chat.completion.chunk","created":200,"model":"m-0613","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`
	continueBody = `{"model":"m","messages":[{"role":"user","content":"say hello"}],"stream":true}`
)

func ev(data string) dialect.Event { return dialect.Event{Data: []byte(data)} }

// TestStream: the role-only chunk opens the stream; content and finish chunks are relayed as
// they are, each a token of progress; the usage-only chunk is a usage frame apart and the
// stream's usage; the stream never ends on an event (its end is [DONE], read below the
// dialect).
func TestStream(t *testing.T) {
	s := openai.New().NewStream(dialect.StreamOptions{Model: "m"})
	opening := []struct {
		name, data string
		want       bool
	}{
		{"role", roleChunk, true},
		{"content", helChunk, false},
		{"finish", finishChunk, false},
		{"usage", usageChunk, false},
		{"not JSON", `nope`, false},
	}
	for _, o := range opening {
		if got := s.Opening(ev(o.data)); got != o.want {
			t.Errorf("Opening(%s) = %v, want %v", o.name, got, o.want)
		}
	}
	for _, data := range []string{roleChunk, helChunk, loChunk, finishChunk} {
		out := s.Decode(ev(data), nil)
		if string(out.Frame) != "data: "+data+"\n\n" || out.Usage != nil || !out.Token || out.Err != nil {
			t.Errorf("Decode(%s) = %+v, want the chunk relayed as it is", data, out)
		}
	}
	if s.Usage() != nil {
		t.Errorf("Usage() before the usage chunk = %+v", s.Usage())
	}
	out := s.Decode(ev(usageChunk), nil)
	if out.Frame != nil || string(out.Usage) != "data: "+usageChunk+"\n\n" || out.Token {
		t.Errorf("usage chunk became %+v, want a usage frame only", out)
	}
	if u := s.Usage(); u == nil || *u != (dialect.Usage{PromptTokens: 9, CompletionTokens: 2, TotalTokens: 11}) {
		t.Errorf("Usage() = %+v", u)
	}
	if s.Ended() || s.ContinuationUsage() != nil {
		t.Errorf("Ended %v, ContinuationUsage %v; want false, none", s.Ended(), s.ContinuationUsage())
	}
}

// TestErrorChunk: a chunk whose top-level object has an "error" member and no "choices" is
// the backend's in-stream error event (vLLM sends one mid-stream, then [DONE]): an error that
// wraps ErrStreamEvent and carries the backend's message, no frame, no token. A chunk that
// only says "error" in its content, or carries choices beside an "error", is relayed as it is.
func TestErrorChunk(t *testing.T) {
	const (
		vllmError   = `{"error":{"message":"mock in-stream error","type":"server_error","param":null,"code":null}}`
		stringError = `{"error":"Overloaded","object":"error"}`
		errorText   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[{"index":0,"delta":{"content":"error"},"finish_reason":null}]}`
		quotedError = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":100,"model":"m-0613","choices":[{"index":0,"delta":{"content":"an \"error\": x"},"finish_reason":null}]}`
		bothMembers = `{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"error":null}`
	)
	tests := []struct {
		name, data string
		msg        string // the error's message; "" for no error
	}{
		{"vLLM error chunk", vllmError, "mock in-stream error"},
		{"error as a string", stringError, "Overloaded"},
		{"spaced", `{ "error" : { "message" : "boom" } }`, "boom"},
		{"normal chunk", helChunk, ""},
		{"content says error", errorText, ""},
		{"content quotes error", quotedError, ""},
		{"choices beside error", bothMembers, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, continued := range []bool{false, true} {
				s, c := startedStream(t, continued)
				out := s.Decode(ev(tt.data), c)
				if tt.msg == "" {
					if out.Err != nil || out.Frame == nil || !out.Token {
						t.Errorf("continued %v: Decode = %+v, want the chunk relayed, no error", continued, out)
					}
					continue
				}
				var ee *dialect.EventError
				if !errors.Is(out.Err, openai.ErrStreamEvent) || !errors.As(out.Err, &ee) || ee.Message != tt.msg {
					t.Errorf("continued %v: Err = %v, want ErrStreamEvent with message %q", continued, out.Err, tt.msg)
				}
				if out.Frame != nil || out.Usage != nil || out.Token {
					t.Errorf("continued %v: Decode = %+v, want no frame, no token", continued, out)
				}
			}
		})
	}
}

// TestContinuation: a tracked stream with output continues on a vLLM backend only: the
// request is the client's with the partial answer as an open assistant message; the
// continuation's role chunk is dropped, its chunks take the original stream's id, created and
// model, its finish chunk says how many continuations and attempts it took; its usage is
// billed as its own attempt while the client is told the usage of the one answer it saw.
func TestContinuation(t *testing.T) {
	vllm := config.Backend{Continuation: config.ContinuationVLLM}
	untracked := openai.New().NewStream(dialect.StreamOptions{Model: "m"})
	untracked.Decode(ev(helChunk), nil)
	if untracked.CanContinue(vllm) {
		t.Error("an untracked stream can be continued")
	}
	s := openai.New().NewStream(dialect.StreamOptions{Track: true, Model: "m"})
	s.Decode(ev(roleChunk), nil)
	if s.CanContinue(vllm) {
		t.Error("a stream without output can be continued")
	}
	s.Decode(ev(helChunk), nil)
	s.Decode(ev(loChunk), nil)
	if s.CanContinue(config.Backend{}) {
		t.Error("a backend without continuation can continue")
	}
	if !s.CanContinue(vllm) {
		t.Fatal("a tracked stream with output cannot be continued on vLLM")
	}
	body, err := s.Continuation([]byte(continueBody))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "testdata/continuation-request.golden", body)

	c := &dialect.Continued{First: true, Resumed: 1, Attempts: 2}
	if out := s.Decode(ev(contRole), c); out.Frame != nil || out.Usage != nil || out.Token {
		t.Errorf("the continuation's role chunk became %+v, want nothing", out)
	}
	c.First = false
	var frames bytes.Buffer
	for _, data := range []string{contContent, contFinish} {
		out := s.Decode(ev(data), c)
		if !out.Token {
			t.Errorf("continuation chunk %s is no token", data)
		}
		frames.Write(out.Frame)
	}
	out := s.Decode(ev(contUsage), c)
	frames.Write(out.Usage)
	testkit.Golden(t, "testdata/continuation-frames.golden", frames.Bytes())
	// 12 prompt tokens include the 2 of the prefix ("Hel", "lo"): the answer the client saw
	// had 10 prompt tokens and 2 + 3 completion tokens.
	if u := s.Usage(); u == nil || *u != (dialect.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}) {
		t.Errorf("Usage() = %+v, want the whole answer's", u)
	}
	if got := s.ContinuationUsage(); len(got) != 1 || got[0] != (dialect.Usage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15}) {
		t.Errorf("ContinuationUsage() = %+v, want the continuation's own", got)
	}
	for _, bad := range []string{`not json`, `{"messages":"x"}`} {
		if _, err := s.Continuation([]byte(bad)); err == nil {
			t.Errorf("Continuation(%s) returned no error", bad)
		}
	}
}

// TestAnswer: a chat.completion goes to the client as it is, its usage read.
func TestAnswer(t *testing.T) {
	tests := []struct {
		name, body string
		want       *dialect.Usage
	}{
		{"usage", `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
			&dialect.Usage{PromptTokens: 5, CompletionTokens: 1, TotalTokens: 6}},
		{"no usage", `{"id":"c","object":"chat.completion","choices":[]}`, nil},
		{"not JSON", `oops`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, u, err := openai.New().Answer([]byte(tt.body), "m")
			if err != nil || string(out) != tt.body {
				t.Errorf("Answer = %s, %v; want the body as it is", out, err)
			}
			if (u == nil) != (tt.want == nil) || (u != nil && *u != *tt.want) {
				t.Errorf("usage %+v, want %+v", u, tt.want)
			}
		})
	}
}

// TestErrors: a backend's error body is already OpenAI's and goes as it is; the gateway's own
// errors are OpenAI error objects of their status's type (a 400 is the client's
// invalid_request_error, a 5xx a server_error), a broken stream's last event a server_error.
func TestErrors(t *testing.T) {
	d := openai.New()
	in := `{"error":{"message":"m","type":"invalid_request_error","param":null,"code":"x"}}`
	if got := string(d.ErrorBody(400, []byte(in))); got != in {
		t.Errorf("ErrorBody = %s, want it as it is", got)
	}
	tests := []struct{ name, got, want string }{
		{"GatewayError", string(d.GatewayError(503, "backend_unavailable", "no backend")),
			`{"error":{"message":"no backend","type":"server_error","param":null,"code":"backend_unavailable"}}`},
		{"GatewayError 400", string(d.GatewayError(400, "unsupported_by_backend", "no tools")),
			`{"error":{"message":"no tools","type":"invalid_request_error","param":null,"code":"unsupported_by_backend"}}`},
		{"StreamError", string(d.StreamError("broke")),
			`{"error":{"message":"broke","type":"server_error","param":null,"code":"stream_interrupted"}}`},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %s\nwant %s", tt.name, tt.got, tt.want)
		}
	}
}

// TestDegraded: the route's message is a complete chat.completion of the route's model, with
// zero usage.
func TestDegraded(t *testing.T) {
	var c struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage map[string]int `json:"usage"`
	}
	b := openai.New().Degraded("k1", "m", "try later")
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if c.ID != "chatcmpl-degraded-k1" || c.Object != "chat.completion" || c.Created == 0 || c.Model != "m" || len(c.Choices) != 1 ||
		c.Choices[0].Message.Role != "assistant" || c.Choices[0].Message.Content != "try later" || c.Choices[0].FinishReason != "stop" ||
		len(c.Usage) != 3 || c.Usage["total_tokens"] != 0 {
		t.Errorf("Degraded = %s", b)
	}
}

// startedStream is a tracked stream that has sent helChunk and, when continued, the
// Continued of its continuation's events (nil otherwise).
func startedStream(t *testing.T, continued bool) (dialect.Stream, *dialect.Continued) {
	t.Helper()
	s := openai.New().NewStream(dialect.StreamOptions{Track: true, Model: "m"})
	s.Decode(ev(helChunk), nil)
	if !continued {
		return s, nil
	}
	if _, err := s.Continuation([]byte(continueBody)); err != nil {
		t.Fatal(err)
	}
	return s, &dialect.Continued{Resumed: 1, Attempts: 2}
}

// FuzzStream: any event, in a stream or in its continuation, decodes without panicking into
// frames that are SSE data lines of valid JSON (or the event as it came).
func FuzzStream(f *testing.F) {
	for _, s := range []string{roleChunk, helChunk, finishChunk, usageChunk, contUsage, `{"choices":[{"delta":{"content":null}}]}`,
		`{"error":{"message":"mock in-stream error","type":"server_error","param":null,"code":null}}`, `{"error":"x"}`} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, in []byte, continued bool) {
		s, c := startedStream(t, continued)
		s.Opening(dialect.Event{Data: in})
		out := s.Decode(dialect.Event{Data: in}, c)
		for _, frame := range [][]byte{out.Frame, out.Usage} {
			if frame == nil {
				continue
			}
			data, ok := bytes.CutPrefix(frame, []byte("data: "))
			data, ok2 := bytes.CutSuffix(data, []byte("\n\n"))
			if !ok || !ok2 || (!json.Valid(data) && !bytes.Equal(data, in)) {
				t.Fatalf("frame %q of event %q", frame, in)
			}
		}
	})
}
