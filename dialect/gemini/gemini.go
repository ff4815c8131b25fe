// Package gemini is the dialect of Google's Gemini API (generateContent, and
// streamGenerateContent with alt=sse) for Chat Completions clients: the client's chat request
// becomes a GenerateContentRequest (system messages as systemInstruction, assistant turns as
// role "model", the sampling fields in generationConfig), the key goes in x-goog-api-key, and
// the backend's GenerateContentResponse events become chat.completion.chunk frames (usage from
// usageMetadata, in the usage-only chunk); a non-stream answer becomes a chat.completion and a
// Google error body an OpenAI one. A Gemini stream has no [DONE]: it ends after the event that
// carries a finishReason. Requests Gemini has no translation for here (tools, images, n > 1)
// are refused before anything is sent. A Gemini stream is not continued after a break.
//
// A Stream is not safe for concurrent use; the rest is.
package gemini

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// BackendType is the configured type of a Gemini backend.
const BackendType = config.TypeGemini

// Dialect is the Gemini dialect; what is said without a backend is OpenAI's.
type Dialect struct{ openai.Dialect }

// New returns the dialect.
func New() Dialect { return Dialect{} }

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "gemini" }

// BackendType implements dialect.Dialect.
func (Dialect) BackendType() string { return BackendType }

// chatRequest is what the translation reads of a Chat Completions request.
type chatRequest struct {
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	N                   *int            `json:"n"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`
	ResponseFormat      *struct {
		Type string `json:"type"`
	} `json:"response_format"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Wire types of the Gemini API (field order is the byte order sent).
type part struct {
	Text string `json:"text"`
}

type content struct {
	Role  string `json:"role,omitempty"`
	Parts []part `json:"parts"`
}

type generationConfig struct {
	MaxOutputTokens  *int      `json:"maxOutputTokens,omitempty"`
	Temperature      *float64  `json:"temperature,omitempty"`
	TopP             *float64  `json:"topP,omitempty"`
	StopSequences    *[]string `json:"stopSequences,omitempty"`
	Seed             *int64    `json:"seed,omitempty"`
	PresencePenalty  *float64  `json:"presencePenalty,omitempty"`
	FrequencyPenalty *float64  `json:"frequencyPenalty,omitempty"`
	ResponseMIMEType string    `json:"responseMimeType,omitempty"`
}

type request struct {
	Contents          []content         `json:"contents"`
	SystemInstruction *content          `json:"systemInstruction,omitempty"`
	GenerationConfig  *generationConfig `json:"generationConfig,omitempty"`
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: gemini: %s", dialect.ErrBadRequest, fmt.Sprintf(format, args...))
}

// Translate turns a Chat Completions request body into a GenerateContentRequest body.
func Translate(body []byte) ([]byte, error) {
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return nil, bad("the request is not a chat request: %v", err)
	}
	switch {
	case len(cr.Tools) > 0 && string(cr.Tools) != "null", len(cr.Functions) > 0 && string(cr.Functions) != "null":
		return nil, bad("tools are not translated")
	case cr.N != nil && *cr.N != 1:
		return nil, bad("n must be 1")
	case len(cr.Messages) == 0:
		return nil, bad("messages must not be empty")
	}
	var req request
	for i, m := range cr.Messages {
		text, err := textOf(m.Content)
		if err != nil {
			return nil, bad("messages[%d]: %v", i, err)
		}
		switch m.Role {
		case "system", "developer":
			if req.SystemInstruction == nil {
				req.SystemInstruction = &content{}
			}
			req.SystemInstruction.Parts = append(req.SystemInstruction.Parts, part{Text: text})
		case "user":
			req.Contents = append(req.Contents, content{Role: "user", Parts: []part{{Text: text}}})
		case "assistant":
			req.Contents = append(req.Contents, content{Role: "model", Parts: []part{{Text: text}}})
		default:
			return nil, bad("messages[%d]: role %q is not translated", i, m.Role)
		}
	}
	if len(req.Contents) == 0 {
		return nil, bad("messages hold no user or assistant turn")
	}
	gc := generationConfig{MaxOutputTokens: cr.MaxCompletionTokens, Temperature: cr.Temperature, TopP: cr.TopP, Seed: cr.Seed,
		PresencePenalty: cr.PresencePenalty, FrequencyPenalty: cr.FrequencyPenalty}
	if gc.MaxOutputTokens == nil {
		gc.MaxOutputTokens = cr.MaxTokens
	}
	if len(cr.Stop) > 0 && string(cr.Stop) != "null" {
		var one string
		var many []string
		if json.Unmarshal(cr.Stop, &one) == nil {
			many = []string{one}
		} else if err := json.Unmarshal(cr.Stop, &many); err != nil {
			return nil, bad("stop must be a string or an array of strings")
		}
		gc.StopSequences = &many
	}
	if rf := cr.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			gc.ResponseMIMEType = "application/json"
		default:
			return nil, bad("response_format %q is not translated", rf.Type)
		}
	}
	if (gc != generationConfig{}) {
		req.GenerationConfig = &gc
	}
	return json.Marshal(req)
}

// textOf is a message's content as text: a string, or text parts.
func textOf(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("content part of type %q is not translated", p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// Prepare translates the request and sends it to the model's generateContent, or
// streamGenerateContent with alt=sse.
func (Dialect) Prepare(req dialect.Request, _ config.Backend) (dialect.Upstream, error) {
	body, err := Translate(req.Body)
	if err != nil {
		return dialect.Upstream{}, err
	}
	path := "/models/" + url.PathEscape(req.Model)
	if req.Stream {
		path += ":streamGenerateContent?alt=sse"
	} else {
		path += ":generateContent"
	}
	return dialect.Upstream{Path: path, Body: body, KeyHeader: "x-goog-api-key"}, nil
}

// response is what is read of a GenerateContentResponse.
type response struct {
	Candidates []struct {
		Content struct {
			Parts []struct {
				Text    string `json:"text"`
				Thought bool   `json:"thought"`
			} `json:"parts"`
		} `json:"content"`
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
	PromptFeedback *struct {
		BlockReason string `json:"blockReason"`
	} `json:"promptFeedback"`
	UsageMetadata *struct {
		PromptTokenCount     int `json:"promptTokenCount"`
		CandidatesTokenCount int `json:"candidatesTokenCount"`
		ThoughtsTokenCount   int `json:"thoughtsTokenCount"`
		TotalTokenCount      int `json:"totalTokenCount"`
	} `json:"usageMetadata"`
	ModelVersion string `json:"modelVersion"`
	ResponseID   string `json:"responseId"`
	Error        *googleError
}

// text is the answer's text in this response (thoughts left out), its finish reason in
// OpenAI's words ("" while it goes on), and its usage.
func (r *response) read() (text, finish string, usage *dialect.Usage) {
	if len(r.Candidates) > 0 {
		c := r.Candidates[0]
		var b strings.Builder
		for _, p := range c.Content.Parts {
			if !p.Thought {
				b.WriteString(p.Text)
			}
		}
		text = b.String()
		finish = finishReason(c.FinishReason)
	} else if r.PromptFeedback != nil && r.PromptFeedback.BlockReason != "" {
		finish = "content_filter"
	}
	if u := r.UsageMetadata; u != nil {
		usage = &dialect.Usage{PromptTokens: u.PromptTokenCount, CompletionTokens: u.CandidatesTokenCount + u.ThoughtsTokenCount}
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		if u.TotalTokenCount > usage.TotalTokens {
			usage.TotalTokens = u.TotalTokenCount
		}
	}
	return text, finish, usage
}

// finishReason is Gemini's finishReason in OpenAI's words.
func finishReason(r string) string {
	switch r {
	case "", "FINISH_REASON_UNSPECIFIED":
		return ""
	case "STOP":
		return "stop"
	case "MAX_TOKENS":
		return "length"
	}
	return "content_filter" // SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT, SPII, OTHER…
}

// completionID is the chat id of a Gemini response.
func completionID(responseID string) string {
	if responseID == "" {
		return fmt.Sprintf("chatcmpl-gemini-%d", time.Now().UnixNano())
	}
	return "chatcmpl-" + responseID
}

// Answer turns a GenerateContentResponse into a chat.completion.
func (Dialect) Answer(body []byte, model string) ([]byte, *dialect.Usage, error) {
	var r response
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, nil, fmt.Errorf("gemini: answer: %w", err)
	}
	text, finish, usage := r.read()
	if finish == "" {
		finish = "stop"
	}
	if r.ModelVersion != "" {
		model = r.ModelVersion
	}
	out, err := openai.Completion(completionID(r.ResponseID), model, text, finish, usage)
	return out, usage, err
}

// googleError is the error body of Google APIs.
type googleError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Status  string `json:"status"`
}

// ErrorBody turns a Google error body ({"error": {"code", "message", "status"}}) into an
// OpenAI one: the message kept, the status as the code, the type by HTTP status.
func (Dialect) ErrorBody(status int, body []byte) []byte {
	var e struct {
		Error *googleError `json:"error"`
	}
	msg, code := fmt.Sprintf("the gemini backend failed with status %d", status), ""
	if json.Unmarshal(body, &e) == nil && e.Error != nil {
		if e.Error.Message != "" {
			msg = e.Error.Message
		}
		code = strings.ToLower(e.Error.Status)
	}
	return openaiwire.ErrorBody(msg, openaiwire.ErrorType(status), code, "")
}

// NewStream implements dialect.Dialect.
func (Dialect) NewStream(o dialect.StreamOptions) dialect.Stream {
	return &Stream{chunks: openai.Chunks{Model: o.Model}}
}

// ErrStreamError is a Stream's Out.Err for an error object in the stream (a
// *dialect.EventError with the object's message), or for an event that is not JSON.
var ErrStreamError = errors.New("gemini: error in the stream")

// Stream decodes a streamGenerateContent (alt=sse) stream into chat.completion.chunk frames.
// Gemini has no way to continue a given answer: it is never continued.
type Stream struct {
	dialect.NotContinued
	chunks openai.Chunks
	usage  *dialect.Usage
	ended  bool
}

// Opening: Gemini has no opening event; its first event carries text.
func (s *Stream) Opening(dialect.Event) bool { return false }

// Decode turns one GenerateContentResponse into chunks: the role chunk before the first, a
// content chunk when it has text, a finish chunk and the usage-only chunk when it ends.
func (s *Stream) Decode(ev dialect.Event, _ *dialect.Continued) dialect.Out {
	var r response
	if err := json.Unmarshal(ev.Data, &r); err != nil {
		return dialect.Out{Err: fmt.Errorf("%w: %v", ErrStreamError, err)}
	}
	if r.Error != nil {
		return dialect.Out{Err: &dialect.EventError{Kind: ErrStreamError, Message: r.Error.Message}}
	}
	var out dialect.Out
	if s.chunks.ID == "" {
		s.chunks.ID, s.chunks.Created = completionID(r.ResponseID), time.Now().Unix()
		if r.ModelVersion != "" {
			s.chunks.Model = r.ModelVersion
		}
		out.Frame = s.chunks.Append(out.Frame, map[string]any{"role": "assistant", "content": ""}, nil)
	}
	text, finish, usage := r.read()
	if usage != nil {
		s.usage = usage
	}
	if text != "" {
		out.Frame = s.chunks.Append(out.Frame, map[string]any{"content": text}, nil)
		out.Token = true
	}
	if finish != "" && !s.ended {
		s.ended = true
		out.Frame = s.chunks.Append(out.Frame, map[string]any{}, &finish)
		out.Usage = s.chunks.Usage(s.usage)
	}
	return out
}

// Ended: the event with a finishReason was seen.
func (s *Stream) Ended() bool { return s.ended }

// Usage implements dialect.Stream.
func (s *Stream) Usage() *dialect.Usage { return s.usage }
