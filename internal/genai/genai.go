// Package genai names what oncegate tells tracing backends and LLM observability tools in the
// OpenTelemetry semantic conventions for generative AI, version 1.41.0 (status development,
// what instrumentations emit with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental):
// the gen_ai.* span attributes, the provider names, the operation names, and the reading of
// an answer (in the client's API: Chat Completions, Anthropic Messages, Responses) for the
// response model, id, finish reasons and, when content capture is on, the text.
//
// The gateway is a GenAI client of its backends: the backend attempt's span and the
// execution's span carry these attributes beside oncegate's own (oncegate.*), and the workers
// record the client metrics (gen_ai.client.token.usage, gen_ai.client.operation.duration,
// gen_ai.client.operation.time_to_first_chunk) through internal/telemetry.
//
// Everything here is a pure function of its arguments, safe for concurrent use.
package genai

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/oncegate/oncegate/internal/openaiwire"
)

// SemconvVersion is the version of the semantic conventions followed.
const SemconvVersion = "1.41.0"

// Attribute keys of the conventions (gen_ai.* and the general ones they use).
const (
	OperationName      attribute.Key = "gen_ai.operation.name"
	ProviderName       attribute.Key = "gen_ai.provider.name"
	RequestModel       attribute.Key = "gen_ai.request.model"
	ResponseModel      attribute.Key = "gen_ai.response.model"
	ResponseID         attribute.Key = "gen_ai.response.id"
	FinishReasons      attribute.Key = "gen_ai.response.finish_reasons"
	InputTokens        attribute.Key = "gen_ai.usage.input_tokens"  // #nosec G101 -- an attribute name, not a credential
	OutputTokens       attribute.Key = "gen_ai.usage.output_tokens" // #nosec G101 -- an attribute name, not a credential
	InputMessages      attribute.Key = "gen_ai.input.messages"
	OutputMessages     attribute.Key = "gen_ai.output.messages"
	SystemInstructions attribute.Key = "gen_ai.system_instructions"
	ServerAddress      attribute.Key = "server.address"
	ServerPort         attribute.Key = "server.port"
	ErrorType          attribute.Key = "error.type"
)

// Operation names (gen_ai.operation.name).
const (
	OpChat       = "chat"
	OpEmbeddings = "embeddings"
)

// Provider names (gen_ai.provider.name): the conventions' well-known values, and custom ones
// for what they do not name.
const (
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
	ProviderGemini    = "gcp.gemini"
	ProviderAzure     = "azure.ai.openai"
	ProviderBedrock   = "aws.bedrock"
	// ProviderOncegate is another oncegate in front of the backends (a custom value).
	ProviderOncegate = "oncegate"
	// ProviderMock is the built-in mock backend (a custom value).
	ProviderMock = "oncegate.mock"
)

// Provider is the gen_ai.provider.name of a backend of type backendType (config's backend
// types, spelled out: the metrics import this package, and the dashboard keeps out of
// config). An OpenAI-compatible backend (vLLM, DeepSeek…) is "openai": the conventions name
// the telemetry's flavour by the API spoken, and gen_ai.request.model and server.address tell
// the hosts apart.
func Provider(backendType string) string {
	switch backendType {
	case "anthropic":
		return ProviderAnthropic
	case "gemini":
		return ProviderGemini
	case "azure":
		return ProviderAzure
	case "bedrock":
		return ProviderBedrock
	case "oncegate":
		return ProviderOncegate
	case "mock":
		return ProviderMock
	}
	return ProviderOpenAI
}

// Operation is the gen_ai.operation.name of a request of the client API api ("openai",
// "anthropic", "responses", "embeddings"); "" for an API that is no GenAI operation the
// conventions name (a passthrough path).
func Operation(api string) string {
	switch api {
	case "", "openai", "anthropic", "responses":
		return OpChat
	case "embeddings":
		return OpEmbeddings
	}
	return ""
}

// SpanName is a GenAI client span's name, "{operation} {model}".
func SpanName(op, model string) string {
	if model == "" {
		return op
	}
	return op + " " + model
}

// Server is the host and port of a backend's base URL (server.address, server.port); ok is
// false when it has none (the in-process mock).
func Server(baseURL string) (host string, port int, ok bool) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		return "", 0, false
	}
	host = u.Hostname()
	if p := u.Port(); p != "" {
		port, _ = strconv.Atoi(p)
	} else if u.Scheme == "https" {
		port = 443
	} else {
		port = 80
	}
	return host, port, true
}

// Response is what is read of an answer.
type Response struct {
	ID, Model     string
	FinishReasons []string
	// Text is the answer's text, read only when asked (content capture).
	Text string
}

// ReadResponse reads an answer in any of the client APIs (their shapes do not collide): a
// non-stream body, or (stream) the SSE frames sent to the clients. withText also gathers the
// text. What cannot be read is left empty: telemetry never fails an answer.
func ReadResponse(stream bool, out []byte, withText bool) Response {
	var r Response
	var text strings.Builder
	read := func(data []byte) {
		var v answer
		if json.Unmarshal(data, &v) != nil {
			return
		}
		v.into(&r, withText, &text)
	}
	if !stream {
		read(out)
	} else {
		er := openaiwire.NewEventReader(bytes.NewReader(out))
		for {
			_, data, err := er.NextEvent()
			if err != nil {
				break
			}
			read(data)
		}
	}
	if withText {
		r.Text = text.String()
	}
	return r
}

// answer is the union of what is read of the three APIs' answers and stream events.
type answer struct {
	Type  string `json:"type"`
	ID    string `json:"id"`
	Model string `json:"model"`
	// Chat Completions (answer and chunk).
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Content *string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	// Anthropic Messages (answer, message_start, message_delta, content_block_delta).
	StopReason *string          `json:"stop_reason"`
	Content    json.RawMessage  `json:"content"`
	Message    *answer          `json:"message"`
	Delta      *json.RawMessage `json:"delta"`
	// Responses (answer, and response.* events carrying it).
	Status            string  `json:"status"`
	Response          *answer `json:"response"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
}

func (v *answer) into(r *Response, withText bool, text *strings.Builder) {
	switch {
	case v.Message != nil: // Anthropic message_start
		v.Message.into(r, withText, text)
		return
	case v.Response != nil: // Responses events
		v.Response.into(r, false, text) // its text came as output_text deltas
		return
	}
	if v.ID != "" && r.ID == "" {
		r.ID = v.ID
	}
	if v.Model != "" && r.Model == "" {
		r.Model = v.Model
	}
	for _, c := range v.Choices {
		if c.FinishReason != nil && *c.FinishReason != "" {
			r.FinishReasons = append(r.FinishReasons, *c.FinishReason)
		}
		if withText && c.Message != nil && c.Message.Content != nil {
			text.WriteString(*c.Message.Content)
		}
		if withText && c.Delta != nil && c.Delta.Content != nil {
			text.WriteString(*c.Delta.Content)
		}
	}
	if v.StopReason != nil && *v.StopReason != "" {
		r.FinishReasons = append(r.FinishReasons, *v.StopReason)
	}
	if v.Delta != nil {
		var d struct {
			Type       string  `json:"type"`
			Text       string  `json:"text"`
			StopReason *string `json:"stop_reason"`
		}
		var s string
		switch {
		case json.Unmarshal(*v.Delta, &d) == nil:
			if d.StopReason != nil && *d.StopReason != "" {
				r.FinishReasons = append(r.FinishReasons, *d.StopReason)
			}
			if withText && d.Type == "text_delta" {
				text.WriteString(d.Text)
			}
		case json.Unmarshal(*v.Delta, &s) == nil && withText && v.Type == "response.output_text.delta":
			text.WriteString(s)
		}
	}
	if withText && len(v.Content) > 0 && v.Content[0] == '[' {
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(v.Content, &blocks) == nil {
			for _, b := range blocks {
				if b.Type == "text" {
					text.WriteString(b.Text)
				}
			}
		}
	}
	if v.Status != "" && v.Choices == nil && v.StopReason == nil {
		reason := v.Status
		if v.IncompleteDetails != nil && v.IncompleteDetails.Reason != "" {
			reason = v.IncompleteDetails.Reason
		}
		r.FinishReasons = []string{reason}
		if withText {
			for _, o := range v.Output {
				for _, c := range o.Content {
					if c.Type == "output_text" {
						text.WriteString(c.Text)
					}
				}
			}
		}
	}
}

// part is a message part of the conventions' message format.
type part struct {
	Type    string `json:"type"`
	Content string `json:"content"`
}

type message struct {
	Role         string `json:"role"`
	Parts        []part `json:"parts"`
	FinishReason string `json:"finish_reason,omitempty"`
}

// Input is the request's messages (gen_ai.input.messages) and its system instructions
// (gen_ai.system_instructions, Anthropic's system member), as JSON in the conventions' format,
// text parts only; "" for what the request does not have or cannot be read. Content: only
// when the configuration turns capture on.
func Input(body []byte) (messages, system string) {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Input  json.RawMessage `json:"input"`
		System json.RawMessage `json:"system"`
	}
	if json.Unmarshal(body, &req) != nil {
		return "", ""
	}
	var msgs []message
	for _, m := range req.Messages {
		msgs = append(msgs, message{Role: m.Role, Parts: textParts(m.Content)})
	}
	if len(req.Input) > 0 && len(msgs) == 0 { // Responses: a string, or messages
		if ps := textParts(req.Input); len(ps) > 0 {
			msgs = append(msgs, message{Role: "user", Parts: ps})
		}
	}
	if len(msgs) > 0 {
		b, _ := json.Marshal(msgs)
		messages = string(b)
	}
	if ps := textParts(req.System); len(ps) > 0 {
		b, _ := json.Marshal(ps)
		system = string(b)
	}
	return messages, system
}

// textParts is a content member (a string, or an array of parts or blocks) as text parts.
func textParts(raw json.RawMessage) []part {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil
		}
		return []part{{Type: "text", Content: s}}
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &blocks) != nil {
		return nil
	}
	var out []part
	for _, b := range blocks {
		switch b.Type {
		case "text", "input_text", "output_text":
			out = append(out, part{Type: "text", Content: b.Text})
		}
	}
	return out
}

// Output is the answer's text as gen_ai.output.messages (JSON in the conventions' format).
func Output(r Response) string {
	m := message{Role: "assistant", Parts: []part{{Type: "text", Content: r.Text}}}
	if len(r.FinishReasons) > 0 {
		m.FinishReason = r.FinishReasons[len(r.FinishReasons)-1]
	}
	b, _ := json.Marshal([]message{m})
	return string(b)
}
