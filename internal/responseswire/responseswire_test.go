package responseswire

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
)

// chatFrames builds a chat completions SSE stream: one chunk per text delta, the tool call
// deltas (index, id, name, arguments), then the finish reason and the usage chunk.
func chatFrames(texts []string, calls [][4]string, finish string) []byte {
	var b []byte
	frame := func(v any) {
		j, _ := json.Marshal(v)
		b = append(append(append(b, "data: "...), j...), "\n\n"...)
	}
	frame(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []any{
		map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}}})
	for _, t := range texts {
		frame(map[string]any{"id": "chatcmpl-1", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": t}, "finish_reason": nil}}})
	}
	for _, c := range calls {
		tc := map[string]any{"index": json.Number(c[0]), "function": map[string]any{"arguments": c[3]}}
		if c[1] != "" {
			tc["id"], tc["type"] = c[1], "function"
			tc["function"].(map[string]any)["name"] = c[2]
		}
		frame(map[string]any{"id": "chatcmpl-1", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"tool_calls": []any{tc}}, "finish_reason": nil}}})
	}
	frame(map[string]any{"id": "chatcmpl-1", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}})
	frame(map[string]any{"id": "chatcmpl-1", "choices": []any{}, "usage": map[string]any{"prompt_tokens": 37, "completion_tokens": 11, "total_tokens": 48}})
	return append(b, "data: [DONE]\n\n"...)
}

func testMeta(t *testing.T, body string) Meta {
	t.Helper()
	r, err := Parse([]byte(body))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return Meta{ID: IDOf("01JTEST0000000000000000000"), CreatedAt: 1741290958, Model: r.Model, Params: r.params}
}

// render renders frames whole: Start, Frames, Complete.
func render(t *testing.T, m Meta, frames []byte, after int) []byte {
	t.Helper()
	st := NewStream(m)
	st.After = after
	out := st.Start()
	ev, err := st.Frames(frames)
	if err != nil {
		t.Fatalf("Frames: %v", err)
	}
	return append(append(out, ev...), st.Complete()...)
}

type event struct {
	name string
	data map[string]any
}

func parseEvents(t *testing.T, b []byte) []event {
	t.Helper()
	var out []event
	for _, block := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		var ev event
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.data); err != nil {
					t.Fatalf("event data %q: %v", line, err)
				}
			}
		}
		if ev.name == "" || ev.data == nil || ev.data["type"] != ev.name {
			t.Fatalf("malformed event %q", block)
		}
		out = append(out, ev)
	}
	return out
}

// missingKeys lists the paths of keys in want that got lacks (objects compared key by key,
// arrays element by element while both have one).
func missingKeys(path string, want, got any) []string {
	var out []string
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{path + " (not an object)"}
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				out = append(out, path+"."+k)
				continue
			}
			out = append(out, missingKeys(path+"."+k, v, gv)...)
		}
	case []any:
		g, _ := got.([]any)
		for i := range min(len(w), len(g)) {
			out = append(out, missingKeys(path+"[]", w[i], g[i])...)
		}
	}
	return out
}

// TestDocumentedEvents renders chat streams equivalent to the API reference's examples and
// checks the same events come in the same order, numbered from 0, each with every
// documented field.
func TestDocumentedEvents(t *testing.T) {
	for _, tc := range []struct {
		name, file, body string
		frames           []byte
	}{
		{"text", "testdata/docs-text.sse", `{"model":"gpt-4.1","input":"hi","instructions":"You are a helpful assistant."}`,
			chatFrames([]string{"Hi", " there!"}, nil, "stop")},
		{"function call", "testdata/docs-function-call.sse",
			`{"model":"gpt-4.1","input":"weather in Paris?","tools":[{"type":"function","name":"get_weather","description":"Get current temperature for a given location.","parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"],"additionalProperties":false},"strict":true}]}`,
			chatFrames(nil, [][4]string{{"0", "call_1234xyz", "get_weather", `{"location":`}, {"0", "", "", `"Paris, France"}`}}, "tool_calls")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			want := parseEvents(t, doc)
			got := parseEvents(t, render(t, testMeta(t, tc.body), tc.frames, -1))
			names := func(evs []event) (out []string) {
				for _, e := range evs {
					out = append(out, e.name)
				}
				return out
			}
			if !slices.Equal(names(got), names(want)) {
				t.Fatalf("events\n%v\nwant (documented)\n%v", names(got), names(want))
			}
			for i := range want {
				if seq, _ := got[i].data["sequence_number"].(float64); int(seq) != i {
					t.Errorf("event %d (%s): sequence_number %v", i, got[i].name, got[i].data["sequence_number"])
				}
				if miss := missingKeys(got[i].name, want[i].data, got[i].data); len(miss) > 0 {
					t.Errorf("event %d lacks documented fields %v", i, miss)
				}
			}
			last := got[len(got)-1].data["response"].(map[string]any)
			if tc.name == "function call" {
				out := last["output"].([]any)[0].(map[string]any)
				if out["arguments"] != `{"location":"Paris, France"}` || out["call_id"] != "call_1234xyz" || out["name"] != "get_weather" {
					t.Errorf("function call output %v", out)
				}
			}
			if u := last["usage"].(map[string]any); u["input_tokens"] != 37.0 || u["output_tokens"] != 11.0 || u["total_tokens"] != 48.0 {
				t.Errorf("usage %v", u)
			}
		})
	}
}

// TestRenderGolden pins the exact bytes of a rendering (a text answer that hit the token
// limit, then a tool call).
func TestRenderGolden(t *testing.T) {
	m := testMeta(t, `{"model":"m","input":"x","max_output_tokens":5,"metadata":{"k":"v"}}`)
	frames := chatFrames([]string{"a <b>", " & c"}, [][4]string{{"0", "call_1", "f", `{}`}}, "length")
	testkit.Golden(t, "testdata/incomplete.golden", render(t, m, frames, -1))
}

// TestGroupingDoesNotMatter: however the frames are cut into chunks (whole, frame by frame,
// in pieces that split frames), the bytes are the same, and a resume after N gives exactly
// the events after N.
func TestGroupingDoesNotMatter(t *testing.T) {
	m := testMeta(t, `{"model":"m","input":"x"}`)
	frames := chatFrames([]string{"one", " two", " three"}, [][4]string{{"0", "call_a", "f", `{"a":`}, {"1", "call_b", "g", `{}`}, {"0", "", "", `1}`}}, "tool_calls")
	whole := render(t, m, frames, -1)
	for _, size := range []int{1, 7, 64} {
		st := NewStream(m)
		out := st.Start()
		for i := 0; i < len(frames); i += size {
			ev, err := st.Frames(frames[i:min(i+size, len(frames))])
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ev...)
		}
		out = append(out, st.Complete()...)
		if !bytes.Equal(out, whole) {
			t.Fatalf("pieces of %d bytes render\n%s\nwant\n%s", size, out, whole)
		}
	}
	events := strings.SplitAfter(string(whole), "\n\n")
	for _, after := range []int{0, 3, 10, len(events) - 3} {
		got := render(t, m, frames, after)
		if want := strings.Join(events[after+1:], ""); string(got) != want {
			t.Errorf("after %d:\n%s\nwant\n%s", after, got, want)
		}
	}
}

func TestFail(t *testing.T) {
	m := testMeta(t, `{"model":"m","input":"x"}`)
	st := NewStream(m)
	out := st.Start()
	ev, _ := st.Frames(chatFrames([]string{"par"}, nil, "")[:60])
	out = append(append(out, ev...), st.Fail(StatusCancelled, "job_cancelled", "the job was cancelled")...)
	evs := parseEvents(t, out)
	last := evs[len(evs)-1]
	r := last.data["response"].(map[string]any)
	if last.name != "response.failed" || r["status"] != StatusCancelled || r["error"].(map[string]any)["code"] != "job_cancelled" {
		t.Errorf("last event %v", last)
	}
	if again := st.Complete(); len(again) != 0 {
		t.Errorf("an ended stream rendered more: %s", again)
	}
}

// TestChat pins the chat request each Responses request becomes.
func TestChat(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"string input", `{"model":"m","input":"hello","instructions":"be brief","max_output_tokens":50,"temperature":0.2}`},
		{"items", `{"model":"m","input":[{"role":"developer","content":"rules"},{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://x/y.png","detail":"low"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"g","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c1","output":"r1"},{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"r2"}]},{"type":"reasoning","id":"rs_1","summary":[]}]}`},
		{"tools and format", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false,"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true}},"reasoning":{"effort":"low"}}`},
		{"extra body", `{"model":"m","input":"x","top_k":5,"mock":{"tokens":3},"store":false,"include":["x"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			chat, err := r.Chat(nil)
			if err != nil {
				t.Fatalf("Chat: %v", err)
			}
			echo, err := r.Echo(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(chat) || !json.Valid(echo) {
				t.Fatalf("invalid JSON: %s / %s", chat, echo)
			}
			testkit.Golden(t, "testdata/chat-"+strings.ReplaceAll(tc.name, " ", "-")+".golden",
				append(append(append(chat, '\n'), echo...), '\n'))
		})
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, body, param, code string }{
		{"no model", `{"input":"x"}`, "model", "missing_required_parameter"},
		{"empty input", `{"model":"m","input":""}`, "input", "missing_required_parameter"},
		{"messages", `{"model":"m","messages":[]}`, "messages", "unsupported_parameter"},
		{"conversation", `{"model":"m","input":"x","conversation":"c"}`, "conversation", "unsupported_parameter"},
		{"hosted tool", `{"model":"m","input":"x","tools":[{"type":"file_search"}]}`, "tools[0].type", "unsupported_parameter"},
		{"unnamed function", `{"model":"m","input":"x","tools":[{"type":"function"}]}`, "tools[0].name", "invalid_value"},
		{"bad tool choice", `{"model":"m","input":"x","tool_choice":"sometimes"}`, "tool_choice", "invalid_value"},
		{"zero tokens", `{"model":"m","input":"x","max_output_tokens":0}`, "max_output_tokens", "invalid_value"},
		{"background without store", `{"model":"m","input":"x","background":true,"store":false}`, "store", "invalid_value"},
		{"stream not bool", `{"model":"m","input":"x","stream":"yes"}`, "stream", "invalid_value"},
		{"bad role", `{"model":"m","input":[{"role":"robot","content":"x"}]}`, "input[0].role", "invalid_value"},
		{"audio part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_audio"}]}]}`, "input[0].content[0].type", "unsupported_parameter"},
		{"unknown item", `{"model":"m","input":[{"type":"web_search_call"}]}`, "input[0].type", "unsupported_parameter"},
		{"call without id", `{"model":"m","input":[{"type":"function_call","name":"f"}]}`, "input[0]", "invalid_value"},
		{"bad format", `{"model":"m","input":"x","text":{"format":{"type":"xml"}}}`, "text.format.type", "invalid_value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.body))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %v, want an *Error", err)
			}
			if e.Param != tc.param || e.Code != tc.code {
				t.Errorf("param/code = %q/%q, want %q/%q (%s)", e.Param, e.Code, tc.param, tc.code, e.Message)
			}
		})
	}
}

// TestConversation: a stored response continues as its messages and its output.
func TestConversation(t *testing.T) {
	r, err := Parse([]byte(`{"model":"m","input":"q1","instructions":"sys"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Echo(nil)
	echo, err := ParseEcho(b)
	if err != nil {
		t.Fatal(err)
	}
	st := NewStream(Meta{ID: "resp_X", Params: echo.Params})
	_, _ = st.Frames(chatFrames([]string{"a1"}, [][4]string{{"0", "call_1", "f", "{}"}}, "tool_calls"))
	got, _ := json.Marshal(st.Conversation(echo))
	want := `[{"role":"user","content":"q1"},{"role":"assistant","content":"a1","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}]`
	if string(got) != want {
		t.Errorf("conversation\n%s\nwant (instructions are not carried over)\n%s", got, want)
	}
}

// FuzzParseRequest: any body is refused with an *Error or becomes a valid chat request and echo.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{`{"model":"m","input":"x"}`, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}]}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}],"tools":[{"type":"function","name":"n"}],"tool_choice":{"type":"function","name":"n"}}`,
		`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"s","schema":{}}},"top_k":1}`, `[]`, `{"model":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := Parse(body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse error %v is not an *Error", err)
			}
			return
		}
		chat, err := r.Chat(nil)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Chat error %v is not an *Error", err)
			}
			return
		}
		echo, err := r.Echo(nil)
		if err != nil || !json.Valid(chat) || !json.Valid(echo) {
			t.Fatalf("invalid output for %q: %s / %s (%v)", body, chat, echo, err)
		}
	})
}

// FuzzFrames: any bytes fed as chat frames never panic, and however they are cut the
// rendering is the same.
func FuzzFrames(f *testing.F) {
	f.Add(chatFrames([]string{"a", "b"}, [][4]string{{"0", "c", "f", "{}"}}, "stop"), uint8(5))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}\n\n"), uint8(3))
	f.Fuzz(func(t *testing.T, frames []byte, cut uint8) {
		m := Meta{ID: "resp_F", Params: []byte(`{"store":true}`)}
		one := NewStream(m)
		a, errA := one.Frames(frames)
		two := NewStream(m)
		n := int(cut)%(len(frames)+1) + 1
		var b []byte
		var errB error
		for i := 0; i < len(frames) && errB == nil; i += n {
			var ev []byte
			ev, errB = two.Frames(frames[i:min(i+n, len(frames))])
			b = append(b, ev...)
		}
		if (errA == nil) == (errB == nil) && errA == nil {
			a, b = append(a, one.Complete()...), append(b, two.Complete()...)
			if !bytes.Equal(a, b) {
				t.Fatalf("cut every %d bytes:\n%s\nwhole:\n%s", n, b, a)
			}
		}
	})
}

// TestAnthropicRequest pins the Messages request a Responses request becomes: system turns
// joined, consecutive turns of one role merged, function calls as tool_use, their outputs as
// tool_result, images by URL, the default max_tokens.
func TestAnthropicRequest(t *testing.T) {
	r, err := Parse([]byte(`{"model":"claude","instructions":"sys","parallel_tool_calls":false,"user":"u1","input":[{"role":"developer","content":"rules"},{"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://x/y.png"}]},{"role":"user","content":"and"},{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},{"type":"function_call","call_id":"c2","name":"g","arguments":"not json"},{"type":"function_call_output","call_id":"c1","output":"r1"},{"type":"function_call_output","call_id":"c2","output":"r2"}],"tools":[{"type":"function","name":"f"},{"type":"function","name":"g","parameters":{"type":"object"}}],"tool_choice":"required"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Anthropic(nil, 4096)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "testdata/anthropic-request.golden", append(b, '\n'))

	r, err = Parse([]byte(`{"model":"claude","input":"x","text":{"format":{"type":"json_object"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var e *Error
	if _, err := r.Anthropic(nil, 4096); !errors.As(err, &e) || e.Param != "text.format" {
		t.Errorf("a structured format on Anthropic: %v, want a text.format refusal", err)
	}
}
