package responses_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/dialect/responses"
	"github.com/oncegate/oncegate/internal/config"
)

// TestPrepare: the body the gateway wrote goes to /responses byte for byte, with the kept
// headers, the key as Bearer.
func TestPrepare(t *testing.T) {
	body := `{"model":"m","input":"hi","stream":true,"background":false,"store":true}`
	header := http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	up, err := responses.New().Prepare(dialect.Request{API: dialect.APIResponses, Model: "m", Body: []byte(body), Stream: true, Header: header}, config.Backend{})
	if err != nil {
		t.Fatal(err)
	}
	if up.Path != "/responses" || string(up.Body) != body || up.KeyHeader != "" || up.Header.Get("Traceparent") != header.Get("Traceparent") {
		t.Errorf("upstream %s %s, key header %q, headers %v", up.Path, up.Body, up.KeyHeader, up.Header)
	}
}

// TestStream: the opening events are held back; every event is relayed as it came, under
// its name (its type when the backend sent no event: line); text, refusal and function
// argument deltas are the tokens; a terminal event (completed, incomplete, failed) ends the
// stream with its response's usage; an error event is a failed stream.
func TestStream(t *testing.T) {
	tests := []struct {
		name, event, data string
		opening, token    bool
		ended             bool
		usage             *dialect.Usage
		err               error
	}{
		{name: "created", event: "response.created", data: `{"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}`, opening: true},
		{name: "in progress", event: "response.in_progress", data: `{"type":"response.in_progress","response":{"id":"resp_1"}}`, opening: true},
		{name: "queued, no event line", data: `{"type":"response.queued","response":{"id":"resp_1"}}`, opening: true},
		{name: "item added", event: "response.output_item.added", data: `{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}`},
		{name: "text delta", event: "response.output_text.delta", data: `{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`, token: true},
		{name: "text delta, no event line", data: `{"type":"response.output_text.delta","delta":"!"}`, token: true},
		{name: "refusal delta", event: "response.refusal.delta", data: `{"type":"response.refusal.delta","delta":"no"}`, token: true},
		{name: "arguments delta", event: "response.function_call_arguments.delta", data: `{"type":"response.function_call_arguments.delta","delta":"{\"a\""}`, token: true},
		{name: "text done", event: "response.output_text.done", data: `{"type":"response.output_text.done","text":"Hi!"}`},
		{name: "completed", event: "response.completed", data: `{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10}}}`,
			ended: true, usage: &dialect.Usage{PromptTokens: 7, CompletionTokens: 3, TotalTokens: 10}},
		{name: "incomplete", event: "response.incomplete", data: `{"type":"response.incomplete","response":{"status":"incomplete","usage":{"input_tokens":7,"output_tokens":16,"total_tokens":23}}}`,
			ended: true, usage: &dialect.Usage{PromptTokens: 7, CompletionTokens: 16, TotalTokens: 23}},
		{name: "failed without usage", event: "response.failed", data: `{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}`, ended: true},
		{name: "error", event: "error", data: `{"type":"error","code":"server_error","message":"boom","param":null}`, err: responses.ErrStreamEvent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := responses.New().NewStream(dialect.StreamOptions{Model: "m"})
			ev := dialect.Event{Name: tt.event, Data: []byte(tt.data)}
			if got := s.Opening(ev); got != tt.opening {
				t.Errorf("Opening = %v, want %v", got, tt.opening)
			}
			out := s.Decode(ev, nil)
			name := tt.event
			if name == "" {
				var e struct{ Type string }
				_ = json.Unmarshal([]byte(tt.data), &e)
				name = e.Type
			}
			if want := "event: " + name + "\ndata: " + tt.data + "\n\n"; string(out.Frame) != want {
				t.Errorf("frame %q\nwant %q", out.Frame, want)
			}
			if out.Token != tt.token || out.Usage != nil || !errors.Is(out.Err, tt.err) || (tt.err == nil && out.Err != nil) {
				t.Errorf("Decode = token %v, usage frame %q, err %v; want token %v, no usage frame, err %v", out.Token, out.Usage, out.Err, tt.token, tt.err)
			}
			var ee *dialect.EventError
			if tt.err != nil && (!errors.As(out.Err, &ee) || ee.Message != "boom") {
				t.Errorf("Err = %v, want the backend's message boom", out.Err)
			}
			if s.Ended() != tt.ended {
				t.Errorf("Ended = %v, want %v", s.Ended(), tt.ended)
			}
			if u := s.Usage(); (u == nil) != (tt.usage == nil) || (u != nil && *u != *tt.usage) {
				t.Errorf("Usage = %+v, want %+v", u, tt.usage)
			}
		})
	}
}

// TestNeverContinued: a Responses stream with output is not continued, whatever the backend.
func TestNeverContinued(t *testing.T) {
	s := responses.New().NewStream(dialect.StreamOptions{Track: true, Model: "m"})
	s.Decode(dialect.Event{Name: "response.output_text.delta", Data: []byte(`{"type":"response.output_text.delta","delta":"Hi"}`)}, nil)
	for _, b := range []config.Backend{{}, {Continuation: config.ContinuationVLLM}, {Continuation: config.ContinuationAnthropic}} {
		if s.CanContinue(b) {
			t.Errorf("CanContinue(%+v) = true", b)
		}
	}
	if _, err := s.Continuation([]byte(`{"model":"m","input":"hi"}`)); err == nil {
		t.Error("Continuation returned no error")
	}
	if s.ContinuationUsage() != nil {
		t.Errorf("ContinuationUsage = %v", s.ContinuationUsage())
	}
}

// TestSaidWithoutABackend: the Responses API's errors are OpenAI's, so what the gateway says
// on its own (errors, a broken stream's end, degraded answers) and a backend's error body are
// the openai dialect's, byte for byte; the dialect names itself and its API.
func TestSaidWithoutABackend(t *testing.T) {
	d, o := responses.New(), openai.New()
	if d.Name() != "responses" || d.API() != dialect.APIResponses || d.BackendType() != "" {
		t.Errorf("dialect %s, API %s, backend type %q", d.Name(), d.API(), d.BackendType())
	}
	in := []byte(`{"error":{"message":"m","type":"invalid_request_error","param":null,"code":null}}`)
	if got := d.ErrorBody(400, in); !bytes.Equal(got, in) {
		t.Errorf("ErrorBody = %s, want it as it is", got)
	}
	if got, want := d.GatewayError(502, "backend_error", "x"), o.GatewayError(502, "backend_error", "x"); !bytes.Equal(got, want) {
		t.Errorf("GatewayError = %s, want %s", got, want)
	}
	if got, want := d.StreamError("broke"), o.StreamError("broke"); !bytes.Equal(got, want) {
		t.Errorf("StreamError = %s, want %s", got, want)
	}
	var c struct {
		ID     string `json:"id"`
		Object string `json:"object"`
	}
	if err := json.Unmarshal(d.Degraded("k", "m", "later"), &c); err != nil || c.ID != "chatcmpl-degraded-k" || c.Object != "chat.completion" {
		t.Errorf("Degraded = %+v, %v", c, err)
	}
}

// FuzzStream: any event decodes without panicking into one SSE frame carrying the event's
// data as it came, a usage only from a terminal event.
func FuzzStream(f *testing.F) {
	f.Add("response.completed", []byte(`{"type":"response.completed","response":{"usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3}}}`))
	f.Add("", []byte(`{"type":"response.output_text.delta","delta":"a"}`))
	f.Add("error", []byte(`{"type":"error","message":"x"}`))
	f.Fuzz(func(t *testing.T, name string, in []byte) {
		s := responses.New().NewStream(dialect.StreamOptions{Model: "m"})
		s.Opening(dialect.Event{Name: name, Data: in})
		out := s.Decode(dialect.Event{Name: name, Data: in}, nil)
		if !bytes.HasSuffix(out.Frame, append(append([]byte("data: "), in...), '\n', '\n')) {
			t.Fatalf("frame %q does not carry the event %q", out.Frame, in)
		}
		if s.Usage() != nil && !s.Ended() {
			t.Fatalf("usage %+v from a non-terminal event %q", s.Usage(), in)
		}
	})
}
