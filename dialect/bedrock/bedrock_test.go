package bedrock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/bedrock"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

func TestTranslate(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		bad            bool
	}{
		{name: "system, turns, inference config",
			in:   `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]},{"role":"user","content":"again"}],"max_tokens":9,"max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"stop":"END"}`,
			want: `{"messages":[{"role":"user","content":[{"text":"hi"}]},{"role":"assistant","content":[{"text":"yo"}]},{"role":"user","content":[{"text":"again"}]}],"system":[{"text":"be brief"}],"inferenceConfig":{"maxTokens":7,"temperature":0.5,"topP":0.9,"stopSequences":["END"]}}`},
		{name: "a run of one role is one message; blank turns left out",
			in:   `{"messages":[{"role":"developer","content":"a"},{"role":"user","content":"x"},{"role":"user","content":"  "},{"role":"user","content":"y"}],"stop":["p","q"]}`,
			want: `{"messages":[{"role":"user","content":[{"text":"x"},{"text":"y"}]}],"system":[{"text":"a"}],"inferenceConfig":{"stopSequences":["p","q"]}}`},
		{name: "no inference config", in: `{"messages":[{"role":"user","content":"x"}]}`, want: `{"messages":[{"role":"user","content":[{"text":"x"}]}]}`},
		{name: "tools", in: `{"messages":[{"role":"user","content":"x"}],"tools":[{}]}`, bad: true},
		{name: "n", in: `{"messages":[{"role":"user","content":"x"}],"n":2}`, bad: true},
		{name: "image", in: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`, bad: true},
		{name: "json response format", in: `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`, bad: true},
		{name: "assistant first", in: `{"messages":[{"role":"assistant","content":"x"}]}`, bad: true},
		{name: "tool role", in: `{"messages":[{"role":"user","content":"x"},{"role":"tool","content":"y"}]}`, bad: true},
		{name: "stop of numbers", in: `{"messages":[{"role":"user","content":"x"}],"stop":[1]}`, bad: true},
		{name: "not JSON", in: `nope`, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bedrock.Translate([]byte(tc.in))
			if tc.bad {
				if !errors.Is(err, dialect.ErrBadRequest) {
					t.Fatalf("Translate = %s, %v; want ErrBadRequest", got, err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("Translate =\n%s (%v)\nwant\n%s", got, err, tc.want)
			}
		})
	}
}

// TestPrepareSigns: the request goes to the model id's Converse path (an id's ':' escaped as
// the SDK escapes it) with a SigV4 Authorization scoped to the region and service bedrock,
// its date and the session token of temporary credentials.
func TestPrepareSigns(t *testing.T) {
	d := bedrock.NewWith(aws.NewCredentialsCache(staticCreds{aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "secret", SessionToken: "tok"}}))
	b := config.Backend{Type: config.TypeBedrock, BaseURL: "https://bedrock-runtime.eu-west-3.amazonaws.com", ModelIDs: map[string]string{"claude": "anthropic.claude-3-haiku-20240307-v1:0"}}
	up, err := d.Prepare(dialect.Request{API: dialect.APIOpenAI, Model: "claude", Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`), Stream: true}, b)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"; up.Path != want {
		t.Errorf("path %s, want %s", up.Path, want)
	}
	auth := up.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") || !strings.Contains(auth, "/eu-west-3/bedrock/aws4_request") ||
		!strings.Contains(auth, "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token") {
		t.Errorf("Authorization %q", auth)
	}
	if up.Header.Get("X-Amz-Date") == "" || up.Header.Get("X-Amz-Security-Token") != "tok" || up.KeyHeader != "" {
		t.Errorf("headers %v, key header %q", up.Header, up.KeyHeader)
	}
}

type staticCreds struct{ c aws.Credentials }

func (s staticCreds) Retrieve(context.Context) (aws.Credentials, error) { return s.c, nil }

// message is one event-stream message.
func message(typ, name string, payload string) eventstream.Message {
	m := eventstream.Message{Payload: []byte(payload)}
	m.Headers.Set(":message-type", eventstream.StringValue(typ))
	switch typ {
	case "event":
		m.Headers.Set(":event-type", eventstream.StringValue(name))
	case "exception":
		m.Headers.Set(":exception-type", eventstream.StringValue(name))
	}
	return m
}

func encode(t testing.TB, ms ...eventstream.Message) []byte {
	var b bytes.Buffer
	enc := eventstream.NewEncoder()
	for _, m := range ms {
		if err := enc.Encode(&b, m); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

var answer = []eventstream.Message{
	message("event", "messageStart", `{"role":"assistant"}`),
	message("event", "contentBlockStart", `{"contentBlockIndex":0,"start":{}}`),
	message("event", "contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":"Hel"}}`),
	message("event", "contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":"lo"}}`),
	message("event", "contentBlockStop", `{"contentBlockIndex":0}`),
	message("event", "messageStop", `{"stopReason":"max_tokens"}`),
	message("event", "metadata", `{"usage":{"inputTokens":5,"outputTokens":2,"totalTokens":7},"metrics":{"latencyMs":3}}`),
}

// decodeAll reads body as a Stream does and returns its frames, the usage frame, the error
// that ended the reading and the stream.
func decodeAll(body []byte) (frames, usage []byte, end error, st dialect.Stream) {
	st = bedrock.New().NewStream(dialect.StreamOptions{Model: "claude"})
	er := dialect.Events(st, bytes.NewReader(body))
	for {
		name, data, err := er.NextEvent()
		if err != nil {
			return frames, usage, err, st
		}
		out := st.Decode(dialect.Event{Name: name, Data: data}, nil)
		if out.Err != nil {
			return frames, usage, out.Err, st
		}
		frames = append(frames, out.Frame...)
		usage = append(usage, out.Usage...)
	}
}

func TestStream(t *testing.T) {
	frames, usage, end, st := decodeAll(encode(t, answer...))
	if !errors.Is(end, openaiwire.ErrTruncated) || !st.Ended() {
		t.Fatalf("end %v, ended %v: want the clean end of an ended stream", end, st.Ended())
	}
	body, err := openaiwire.Assemble(frames, usage)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Model   string `json:"model"`
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content != "Hello" ||
		c.Choices[0].FinishReason != "length" || c.Usage.Prompt != 5 || c.Usage.Completion != 2 || c.Model != "claude" {
		t.Fatalf("assembled %s (%v)", body, err)
	}
	if u := st.Usage(); u == nil || u.PromptTokens != 5 || u.CompletionTokens != 2 || u.TotalTokens != 7 {
		t.Fatalf("usage %+v", u)
	}
	if !st.Opening(dialect.Event{Name: "messageStart"}) || st.Opening(dialect.Event{Name: "contentBlockDelta"}) {
		t.Fatal("opening events: messageStart and contentBlockStart only")
	}
}

// TestStreamBreaks: a stream cut between messages before its metadata has not ended; one cut
// inside a message, or failing its CRC, is an error of its own; an exception message is an
// error event with its message.
func TestStreamBreaks(t *testing.T) {
	whole := encode(t, answer...)
	upToStop := encode(t, answer[:6]...)
	flipped := bytes.Clone(whole)
	flipped[len(flipped)-10] ^= 0xff
	for _, tc := range []struct {
		name  string
		body  []byte
		check func(error, dialect.Stream) bool
	}{
		{"cut before metadata", upToStop, func(err error, st dialect.Stream) bool { return errors.Is(err, openaiwire.ErrTruncated) && !st.Ended() }},
		{"cut inside a message", whole[:len(whole)-5], func(err error, st dialect.Stream) bool {
			return errors.Is(err, io.ErrUnexpectedEOF) && !st.Ended()
		}},
		{"cut inside a prelude", whole[:len(upToStop)+3], func(err error, st dialect.Stream) bool {
			return errors.Is(err, io.ErrUnexpectedEOF) && !st.Ended()
		}},
		{"a bad CRC", flipped, func(err error, st dialect.Stream) bool {
			return err != nil && !errors.Is(err, openaiwire.ErrTruncated) && !st.Ended()
		}},
		{"an exception", encode(t, answer[0], answer[2], message("exception", "modelStreamErrorException", `{"message":"the model broke"}`)),
			func(err error, _ dialect.Stream) bool {
				var ee *dialect.EventError
				return errors.As(err, &ee) && errors.Is(err, bedrock.ErrStreamError) && ee.Message == "the model broke"
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, end, st := decodeAll(tc.body); !tc.check(end, st) {
				t.Fatalf("ended with %v (ended %v)", end, st.Ended())
			}
		})
	}
}

func TestAnswerAndErrorBody(t *testing.T) {
	out, u, err := bedrock.New().Answer([]byte(`{"output":{"message":{"role":"assistant","content":[{"text":"a"},{"text":"b"}]}},"stopReason":"guardrail_intervened","usage":{"inputTokens":3,"outputTokens":4,"totalTokens":7}}`), "claude")
	if err != nil || u == nil || u.PromptTokens != 3 || u.CompletionTokens != 4 || u.TotalTokens != 7 ||
		!bytes.Contains(out, []byte(`"content":"ab"`)) || !bytes.Contains(out, []byte(`"finish_reason":"content_filter"`)) {
		t.Fatalf("Answer = %s, %+v, %v", out, u, err)
	}
	for _, tc := range []struct {
		status     int
		body, want string
	}{
		{429, `{"__type":"ThrottlingException","message":"Too many requests"}`, `{"error":{"message":"Too many requests","type":"rate_limit_error","param":null,"code":"ThrottlingException"}}`},
		{400, `{"Message":"bad input","code":"ValidationException:http://internal.amazon.com/coral/"}`, `{"error":{"message":"bad input","type":"invalid_request_error","param":null,"code":"ValidationException"}}`},
		{503, `<html>`, `{"error":{"message":"the bedrock backend failed with status 503","type":"server_error","param":null,"code":null}}`},
	} {
		if got := bedrock.New().ErrorBody(tc.status, []byte(tc.body)); strings.TrimSpace(string(got)) != tc.want {
			t.Errorf("ErrorBody(%d, %s) =\n%s\nwant\n%s", tc.status, tc.body, got, tc.want)
		}
	}
}

// FuzzTranslate: any body translates or is refused as a bad request, never panics; a
// translation is a Converse request whose first message is the user's, roles alternating.
func FuzzTranslate(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"x"},{"role":"assistant","content":"y"}],"stop":["a"],"max_tokens":3}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"user","content":"z"}]}`))
	f.Add([]byte(`{"messages":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := bedrock.Translate(body)
		if err != nil {
			if !errors.Is(err, dialect.ErrBadRequest) {
				t.Fatalf("error %v is not ErrBadRequest", err)
			}
			return
		}
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(out, &req); err != nil || len(req.Messages) == 0 || req.Messages[0].Role != "user" {
			t.Fatalf("translation %s (%v)", out, err)
		}
		for i, m := range req.Messages {
			if (i > 0 && m.Role == req.Messages[i-1].Role) || len(m.Content) == 0 {
				t.Fatalf("message %d of %s: roles must alternate, content must not be empty", i, out)
			}
			for _, c := range m.Content {
				if strings.TrimSpace(c.Text) == "" {
					t.Fatalf("a blank text block in %s", out)
				}
			}
		}
	})
}

// FuzzStream: any bytes read as an event stream and decoded end without panicking, in a
// bounded number of events, and never report an end as clean unless the stream ended.
func FuzzStream(f *testing.F) {
	f.Add(encode(f, answer...))
	f.Add(encode(f, answer[0], message("exception", "throttlingException", `{"message":"slow down"}`)))
	f.Add(encode(f, message("error", "", ``)))
	f.Add([]byte{0, 0, 0, 16, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		st := bedrock.New().NewStream(dialect.StreamOptions{Model: "m"})
		er := dialect.Events(st, bytes.NewReader(body))
		for i := 0; ; i++ {
			if i > len(body) {
				t.Fatalf("%d events from %d bytes", i, len(body))
			}
			name, data, err := er.NextEvent()
			if err != nil {
				return
			}
			out := st.Decode(dialect.Event{Name: name, Data: data}, nil)
			if out.Err != nil {
				return
			}
			for _, frame := range [][]byte{out.Frame, out.Usage} {
				if len(frame) > 0 && !bytes.HasPrefix(frame, []byte("data: ")) {
					t.Fatalf("frame %q", frame)
				}
			}
		}
	})
}
