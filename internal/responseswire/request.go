// Package responseswire is the OpenAI Responses API (POST /v1/responses) on top of a Chat
// Completions backend: it reads a Responses request and writes the chat request that runs it,
// and it turns that chat stream back into the Responses event stream and response object.
// Both directions are pure functions of their input, so every copy of an intent, live,
// replayed from a record or resumed on another node, gets the same bytes: the ids of the
// response and of its output items come from the job id, the times from the record, and the
// events from the chat frames one frame at a time (never from how frames were grouped into
// chunks).
package responseswire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Error is a request the gateway refuses (400): Param names the offending field.
type Error struct {
	Param   string
	Code    string
	Message string
}

func (e *Error) Error() string { return "responseswire: " + e.Message }

func invalid(param, format string, args ...any) error {
	return &Error{Param: param, Code: "invalid_value", Message: fmt.Sprintf(format, args...)}
}

func unsupported(param, format string, args ...any) error {
	return &Error{Param: param, Code: "unsupported_parameter", Message: fmt.Sprintf(format, args...)}
}

// Request is a parsed POST /v1/responses body.
type Request struct {
	Model              string
	Stream             bool
	Background         bool
	Store              bool
	PreviousResponseID string
	// MaxOutputTokens is max_output_tokens (0: not set).
	MaxOutputTokens int

	in     wireRequest
	extra  map[string]json.RawMessage // fields passed to the chat request as they are
	input  []json.RawMessage          // the input's chat messages
	params []byte                     // the response object's request fields (see Echo)
}

// wireRequest is the body as sent. Fields the gateway accepts and does not translate are
// read so that they are not unknown.
type wireRequest struct {
	Model              *string          `json:"model"`
	Input              json.RawMessage  `json:"input"`
	Instructions       *string          `json:"instructions"`
	Tools              []tool           `json:"tools"`
	ToolChoice         json.RawMessage  `json:"tool_choice"`
	Temperature        *float64         `json:"temperature"`
	TopP               *float64         `json:"top_p"`
	MaxOutputTokens    *int64           `json:"max_output_tokens"`
	ParallelToolCalls  *bool            `json:"parallel_tool_calls"`
	Text               *textConfig      `json:"text"`
	Metadata           map[string]any   `json:"metadata"`
	User               *string          `json:"user"`
	Store              *bool            `json:"store"`
	Background         *bool            `json:"background"`
	Stream             *bool            `json:"stream"`
	PreviousResponseID *string          `json:"previous_response_id"`
	Reasoning          *reasoningConfig `json:"reasoning"`
	Truncation         *string          `json:"truncation"`

	// Read, not translated: they change nothing a chat backend could honour.
	Include          json.RawMessage `json:"include"`
	PromptCacheKey   json.RawMessage `json:"prompt_cache_key"`
	SafetyIdentifier json.RawMessage `json:"safety_identifier"`
	ServiceTier      json.RawMessage `json:"service_tier"`
	StreamOptions    json.RawMessage `json:"stream_options"`
	TopLogprobs      json.RawMessage `json:"top_logprobs"`
}

type tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

type textConfig struct {
	Format    *textFormat `json:"format,omitempty"`
	Verbosity *string     `json:"verbosity,omitempty"`
}

type textFormat struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

type reasoningConfig struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

// known are the Responses fields Parse reads; refused those that cannot run on a chat backend;
// chatFields those of the chat request the translation writes (a Responses body that sets
// them was meant for the chat endpoint).
var (
	known = set("model", "input", "instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
		"parallel_tool_calls", "text", "metadata", "user", "store", "background", "stream", "previous_response_id",
		"reasoning", "truncation", "include", "prompt_cache_key", "safety_identifier", "service_tier", "stream_options",
		"top_logprobs")
	refused    = set("conversation", "prompt", "max_tool_calls", "context_management")
	chatFields = set("messages", "max_tokens", "max_completion_tokens", "response_format", "reasoning_effort", "n")
)

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// maxTokens bounds max_output_tokens as the chat endpoint bounds max_tokens.
const maxTokens = 1<<31 - 1

// Parse reads a Responses request. It returns an *Error for a request the gateway refuses.
// Fields the Responses API does not define are passed to the chat request as they are (a
// backend's own knobs, as an SDK's extra_body sends them: vLLM's top_k, the mock's mock);
// the Responses fields that cannot run on a chat backend are refused by name.
func Parse(body []byte) (*Request, error) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, invalid(te.Field, "%s must be of type %s", te.Field, te.Type.String())
		}
		return nil, invalid("", "the body is not a valid Responses request: %v", err)
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(body, &all); err != nil {
		return nil, invalid("", "the body is not a JSON object")
	}
	extra := map[string]json.RawMessage{}
	for k, v := range all {
		switch {
		case refused[k]:
			return nil, unsupported(k, "the parameter %q is not supported by this gateway", k)
		case chatFields[k]:
			return nil, unsupported(k, "%q is a Chat Completions parameter; the Responses API does not take it", k)
		case !known[k]:
			extra[k] = v
		}
	}
	r := &Request{in: w, Store: true, extra: extra}
	if w.Model == nil || *w.Model == "" {
		return nil, &Error{Param: "model", Code: "missing_required_parameter", Message: "you must provide a model parameter"}
	}
	r.Model = *w.Model
	if w.Stream != nil {
		r.Stream = *w.Stream
	}
	if w.Background != nil {
		r.Background = *w.Background
	}
	if w.Store != nil {
		r.Store = *w.Store
	}
	if r.Background && !r.Store {
		return nil, invalid("store", "background mode needs store: true (the response is kept to be retrieved)")
	}
	if w.PreviousResponseID != nil {
		r.PreviousResponseID = *w.PreviousResponseID
	}
	if w.MaxOutputTokens != nil {
		if *w.MaxOutputTokens < 1 || *w.MaxOutputTokens > maxTokens {
			return nil, invalid("max_output_tokens", "max_output_tokens must be an integer from 1 to %d", maxTokens)
		}
		r.MaxOutputTokens = int(*w.MaxOutputTokens)
	}
	for i, t := range w.Tools {
		if t.Type != "function" {
			return nil, unsupported(fmt.Sprintf("tools[%d].type", i), "tools of type %q are not supported by this gateway's backends; only function tools are", t.Type)
		}
		if t.Name == "" {
			return nil, invalid(fmt.Sprintf("tools[%d].name", i), "a function tool needs a name")
		}
	}
	if err := checkToolChoice(w.ToolChoice); err != nil {
		return nil, err
	}
	if f := w.Text; f != nil && f.Format != nil {
		switch f.Format.Type {
		case "text", "json_object":
		case "json_schema":
			if f.Format.Name == "" || len(f.Format.Schema) == 0 {
				return nil, invalid("text.format", "a json_schema format needs a name and a schema")
			}
		default:
			return nil, invalid("text.format.type", "text.format.type %q is not one of text, json_object, json_schema", f.Format.Type)
		}
	}
	input, err := inputMessages(w.Input)
	if err != nil {
		return nil, err
	}
	if len(input) == 0 && r.PreviousResponseID == "" {
		return nil, &Error{Param: "input", Code: "missing_required_parameter", Message: "input must be a non-empty string or list of items"}
	}
	r.input = input
	if r.params, err = r.echoParams(); err != nil {
		return nil, err
	}
	return r, nil
}

func checkToolChoice(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			return nil
		}
		return invalid("tool_choice", "tool_choice %q is not one of none, auto, required", s)
	}
	var o struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &o) != nil || o.Type != "function" || o.Name == "" {
		return unsupported("tool_choice", "tool_choice must be none, auto, required or {\"type\":\"function\",\"name\":...}")
	}
	return nil
}

// chatToolChoice is tool_choice in the chat format.
func chatToolChoice(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || raw[0] == '"' {
		return raw
	}
	var o struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(raw, &o)
	b, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": o.Name}})
	return b
}

// inputMessages turns the input (a string, or a list of items) into chat messages.
func inputMessages(raw json.RawMessage) ([]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("input", "input is not a valid string")
		}
		if s == "" {
			return nil, nil
		}
		return []json.RawMessage{mustJSON(chatMessage{Role: "user", Content: jsonString(s)})}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, invalid("input", "input must be a string or a list of items")
	}
	var out []json.RawMessage
	var calls *chatMessage // the assistant message the function calls in a row go into
	flush := func() {
		if calls != nil {
			out = append(out, mustJSON(*calls))
			calls = nil
		}
	}
	for i, it := range items {
		var item inputItem
		if err := json.Unmarshal(it, &item); err != nil {
			return nil, invalid(fmt.Sprintf("input[%d]", i), "input[%d] is not a valid item", i)
		}
		param := fmt.Sprintf("input[%d]", i)
		switch item.Type {
		case "", "message":
			flush()
			m, err := item.message(param)
			if err != nil {
				return nil, err
			}
			out = append(out, mustJSON(m))
		case "function_call":
			if item.CallID == "" || item.Name == "" {
				return nil, invalid(param, "a function_call item needs call_id and name")
			}
			if calls == nil {
				calls = &chatMessage{Role: "assistant", Content: json.RawMessage("null")}
			}
			calls.ToolCalls = append(calls.ToolCalls, chatToolCall{ID: item.CallID, Type: "function",
				Function: chatFunction{Name: item.Name, Arguments: item.Arguments}})
		case "function_call_output":
			flush()
			if item.CallID == "" {
				return nil, invalid(param, "a function_call_output item needs call_id")
			}
			output, err := outputText(item.Output)
			if err != nil {
				return nil, invalid(param+".output", "output must be a string or a list of input_text parts")
			}
			out = append(out, mustJSON(chatMessage{Role: "tool", ToolCallID: item.CallID, Content: jsonString(output)}))
		case "reasoning": // a chat backend has no use for another model's reasoning items
		default:
			return nil, unsupported(param+".type", "input items of type %q are not supported by this gateway's backends", item.Type)
		}
	}
	flush()
	return out, nil
}

// inputItem is any item of an input list.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL string `json:"image_url"`
	Detail   string `json:"detail"`
}

// message is a message item as a chat message: developer becomes system (not every chat
// backend knows the developer role), input parts become chat parts, an assistant's output
// parts its text.
func (it inputItem) message(param string) (chatMessage, error) {
	role := it.Role
	switch role {
	case "user", "system", "assistant":
	case "developer":
		role = "system"
	default:
		return chatMessage{}, invalid(param+".role", "role %q is not one of user, assistant, system, developer", it.Role)
	}
	m := chatMessage{Role: role}
	c := bytes.TrimSpace(it.Content)
	if len(c) > 0 && c[0] == '"' {
		m.Content = c
		return m, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(c, &parts); err != nil {
		return chatMessage{}, invalid(param+".content", "content must be a string or a list of parts")
	}
	if role == "assistant" {
		var text strings.Builder
		for _, p := range parts {
			switch p.Type {
			case "output_text", "input_text":
				text.WriteString(p.Text)
			case "refusal":
				text.WriteString(p.Refusal)
			}
		}
		m.Content = jsonString(text.String())
		return m, nil
	}
	var chat []map[string]any
	for j, p := range parts {
		switch p.Type {
		case "input_text":
			chat = append(chat, map[string]any{"type": "text", "text": p.Text})
		case "input_image":
			if p.ImageURL == "" {
				return chatMessage{}, unsupported(fmt.Sprintf("%s.content[%d]", param, j), "only input_image parts with an image_url are supported")
			}
			img := map[string]any{"url": p.ImageURL}
			if p.Detail != "" {
				img["detail"] = p.Detail
			}
			chat = append(chat, map[string]any{"type": "image_url", "image_url": img})
		default:
			return chatMessage{}, unsupported(fmt.Sprintf("%s.content[%d].type", param, j), "content parts of type %q are not supported by this gateway's backends", p.Type)
		}
	}
	m.Content = mustJSON(chat)
	return m, nil
}

// outputText is a function_call_output's output: a string, or the text of its parts.
func outputText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []chatToolCall  `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Chat is the chat completions request that runs r after history (the conversation of the
// previous response, nil for none): always streamed with usage, so that every copy, stream
// or not, is rendered from the same frames.
func (r *Request) Chat(history []json.RawMessage) ([]byte, error) {
	w := r.in
	var messages []json.RawMessage
	if w.Instructions != nil && *w.Instructions != "" {
		messages = append(messages, mustJSON(chatMessage{Role: "system", Content: jsonString(*w.Instructions)}))
	}
	messages = append(append(messages, history...), r.input...)
	if len(messages) == 0 {
		return nil, &Error{Param: "input", Code: "missing_required_parameter", Message: "input must be a non-empty string or list of items"}
	}
	body := chatRequest{Model: r.Model, Messages: messages, Stream: true, StreamOptions: &streamOptions{IncludeUsage: true},
		Temperature: w.Temperature, TopP: w.TopP, ParallelToolCalls: w.ParallelToolCalls, User: w.User}
	if r.MaxOutputTokens > 0 {
		body.MaxTokens = r.MaxOutputTokens
	}
	for _, t := range w.Tools {
		body.Tools = append(body.Tools, chatTool{Type: "function", Function: chatToolFunction{Name: t.Name,
			Description: t.Description, Parameters: t.Parameters, Strict: t.Strict}})
	}
	if len(w.ToolChoice) > 0 && string(w.ToolChoice) != "null" {
		body.ToolChoice = chatToolChoice(w.ToolChoice)
	}
	if f := w.Text; f != nil && f.Format != nil {
		switch f.Format.Type {
		case "json_object":
			body.ResponseFormat = mustJSON(map[string]string{"type": "json_object"})
		case "json_schema":
			schema := map[string]any{"name": f.Format.Name, "schema": f.Format.Schema}
			if f.Format.Strict != nil {
				schema["strict"] = *f.Format.Strict
			}
			if f.Format.Description != "" {
				schema["description"] = f.Format.Description
			}
			body.ResponseFormat = mustJSON(map[string]any{"type": "json_schema", "json_schema": schema})
		}
	}
	if w.Reasoning != nil && w.Reasoning.Effort != nil {
		body.ReasoningEffort = *w.Reasoning.Effort
	}
	return r.withExtra(body)
}

// withExtra marshals a backend request body, with the request's extra fields after its own,
// in name order.
func (r *Request) withExtra(body any) ([]byte, error) {
	out, err := marshal(body)
	if err != nil || len(r.extra) == 0 {
		return out, err
	}
	names := make([]string, 0, len(r.extra))
	for k := range r.extra {
		names = append(names, k)
	}
	sort.Strings(names)
	out = out[:len(out)-1]
	for _, k := range names {
		out = append(append(append(append(out, ','), mustJSON(k)...), ':'), r.extra[k]...)
	}
	return append(out, '}'), nil
}

type chatRequest struct {
	Model             string            `json:"model"`
	Messages          []json.RawMessage `json:"messages"`
	Stream            bool              `json:"stream"`
	StreamOptions     *streamOptions    `json:"stream_options,omitempty"`
	MaxTokens         int               `json:"max_tokens,omitempty"`
	Temperature       *float64          `json:"temperature,omitempty"`
	TopP              *float64          `json:"top_p,omitempty"`
	Tools             []chatTool        `json:"tools,omitempty"`
	ToolChoice        json.RawMessage   `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls,omitempty"`
	ResponseFormat    json.RawMessage   `json:"response_format,omitempty"`
	ReasoningEffort   string            `json:"reasoning_effort,omitempty"`
	User              *string           `json:"user,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatTool struct {
	Type     string           `json:"type"`
	Function chatToolFunction `json:"function"`
}

type chatToolFunction struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Native is the body a native Responses backend gets: the request as the client wrote it,
// streamed (every copy is rendered from the same stored events), not in background (the
// gateway runs the job), and continuing upstream (the backend's id of the previous response).
func Native(body []byte, upstreamPrevious string) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, invalid("", "the body is not a JSON object")
	}
	fields["stream"] = json.RawMessage("true")
	delete(fields, "background")
	if upstreamPrevious != "" {
		fields["previous_response_id"] = mustJSON(upstreamPrevious)
	}
	return marshal(fields)
}

// echoParams are the response object's fields that repeat the request, with the API's
// defaults for what it left out.
func (r *Request) echoParams() ([]byte, error) {
	w := r.in
	p := params{Background: r.Background, Instructions: w.Instructions, MaxOutputTokens: w.MaxOutputTokens,
		ParallelToolCalls: true, Store: r.Store, Temperature: 1, TopP: 1, Truncation: "disabled", User: w.User,
		Metadata: w.Metadata, ToolChoice: json.RawMessage(`"auto"`), Tools: []tool{},
		Text: textConfig{Format: &textFormat{Type: "text"}}}
	if r.PreviousResponseID != "" {
		p.PreviousResponseID = &r.PreviousResponseID
	}
	if w.ParallelToolCalls != nil {
		p.ParallelToolCalls = *w.ParallelToolCalls
	}
	if w.Temperature != nil {
		p.Temperature = *w.Temperature
	}
	if w.TopP != nil {
		p.TopP = *w.TopP
	}
	if w.Truncation != nil {
		p.Truncation = *w.Truncation
	}
	if p.Metadata == nil {
		p.Metadata = map[string]any{}
	}
	if len(w.ToolChoice) > 0 && string(w.ToolChoice) != "null" {
		p.ToolChoice = w.ToolChoice
	}
	if w.Tools != nil {
		p.Tools = w.Tools
	}
	if w.Text != nil && w.Text.Format != nil {
		p.Text = *w.Text
	}
	if w.Reasoning != nil {
		p.Reasoning = *w.Reasoning
	}
	return marshal(p)
}

type params struct {
	Background         bool            `json:"background"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int64          `json:"max_output_tokens"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Reasoning          reasoningConfig `json:"reasoning"`
	Store              bool            `json:"store"`
	Temperature        float64         `json:"temperature"`
	Text               textConfig      `json:"text"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              []tool          `json:"tools"`
	TopP               float64         `json:"top_p"`
	Truncation         string          `json:"truncation"`
	User               *string         `json:"user"`
	Metadata           map[string]any  `json:"metadata"`
}

// Echo is what a record keeps for the Responses API beyond the backend's answer: the request
// fields its response object repeats and, when the response is stored, its conversation (the
// chat messages it was asked with, instructions aside, which a continuation does not inherit).
type Echo struct {
	Params   json.RawMessage   `json:"params"`
	Messages []json.RawMessage `json:"messages,omitempty"`
}

// Echo is r's Echo after history.
func (r *Request) Echo(history []json.RawMessage) ([]byte, error) {
	e := Echo{Params: r.params}
	if r.Store {
		e.Messages = append(append([]json.RawMessage{}, history...), r.input...)
	}
	return marshal(e)
}

// ParseEcho reads a record's Echo.
func ParseEcho(b []byte) (*Echo, error) {
	var e Echo
	if err := json.Unmarshal(b, &e); err != nil || len(e.Params) == 0 || e.Params[0] != '{' {
		return nil, fmt.Errorf("responseswire: not an echo: %w", errors.Join(err, errMalformed))
	}
	return &e, nil
}

var errMalformed = errors.New("responseswire: malformed")

func jsonString(s string) json.RawMessage { return mustJSON(s) }

// mustJSON marshals values that always marshal (strings, maps of them, the types above).
func mustJSON(v any) json.RawMessage {
	b, err := marshal(v)
	if err != nil {
		panic(fmt.Sprintf("responseswire: marshal %T: %v", v, err))
	}
	return b
}

// marshal is json.Marshal without HTML escaping (the API writes <, > and & as they are).
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
