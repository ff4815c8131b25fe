// Package bedrock is the dialect of Amazon Bedrock's Converse API for Chat Completions
// clients:
//
//   - the client's chat request becomes a Converse request (system and developer messages as
//     system blocks, user and assistant turns as messages of text blocks, a run of turns of
//     one role as one message, max_tokens, temperature, top_p and stop in inferenceConfig),
//     sent to /model/{model id}/converse, or /converse-stream for a stream, the model id from
//     the backend's model_ids (else the model's name);
//   - each request is signed with SigV4 (service "bedrock", the backend's region) by the AWS
//     SDK for Go v2's signer, with credentials from the SDK's standard chain (environment,
//     shared config and credentials files, SSO, web identity, the container or instance
//     role), loaded once per backend type per process and refreshed by the SDK's cache. The
//     signature is made when the request is prepared; the retry policy's re-sends of it stay
//     well inside the five minutes AWS accepts a signed request for;
//   - ConverseStream's answer is not SSE but AWS's binary event stream
//     (application/vnd.amazon.eventstream), framed and checked (prelude and message CRCs) by
//     the SDK's eventstream decoder: the Stream is dialect.Framed. Its events become
//     chat.completion.chunk frames: messageStart opens the stream (held until the first
//     content, like an OpenAI role chunk), contentBlockDelta's text is a content chunk,
//     messageStop's stopReason the finish chunk, and metadata's usage the usage-only chunk;
//     the stream has ended once metadata came. An exception message in the stream
//     (modelStreamErrorException, throttlingException…) is an error event: a break, re-sent
//     before the first token, else a clear end with the partial output. Bedrock cannot
//     continue a given answer;
//   - a Converse answer becomes a chat.completion (usage from its usage), and a Bedrock error
//     body ({"__type"|"code", "message"|"Message"}) an OpenAI error of the same status, its
//     exception name as the code.
//
// Requests Bedrock has no translation for here (tools, images, n > 1, a response format)
// are refused before anything is sent. A Stream is not safe for concurrent use; the rest is.
package bedrock

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// BackendType is the configured type of a Bedrock backend.
const BackendType = config.TypeBedrock

// SigningName is the service name Bedrock's runtime requests are signed for.
const SigningName = "bedrock"

// Errors of the dialect.
var (
	// ErrCredentials: no AWS credentials could be had from the standard chain; nothing was
	// sent.
	ErrCredentials = errors.New("bedrock: no AWS credentials")
	// ErrStreamError is a Stream's Out.Err for an exception (or error) message in the stream,
	// a *dialect.EventError with its message, or for an event whose payload is not JSON.
	ErrStreamError = errors.New("bedrock: error in the stream")
)

// Dialect is the Bedrock dialect; what is said without a backend is OpenAI's.
type Dialect struct {
	openai.Dialect
	creds *credentials
}

// New returns the dialect, credentials from the SDK's standard chain (loaded on first use).
func New() Dialect { return NewWith(nil) }

// NewWith returns the dialect with credentials from provider (tests); nil: the standard chain.
func NewWith(provider aws.CredentialsProvider) Dialect {
	return Dialect{creds: &credentials{provider: provider}}
}

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "bedrock" }

// BackendType implements dialect.Dialect.
func (Dialect) BackendType() string { return BackendType }

// credentials loads the standard chain once; its provider is the SDK's cache, safe for
// concurrent use and refreshing what expires.
type credentials struct {
	once     sync.Once
	provider aws.CredentialsProvider
	err      error
}

// credentialTimeout bounds loading and retrieving credentials (an instance role's endpoint).
const credentialTimeout = 10 * time.Second

func (c *credentials) get() (aws.Credentials, error) {
	ctx, cancel := context.WithTimeout(context.Background(), credentialTimeout)
	defer cancel()
	c.once.Do(func() {
		if c.provider != nil {
			return
		}
		cfg, err := awsconfig.LoadDefaultConfig(ctx)
		switch {
		case err != nil:
			c.err = fmt.Errorf("%w: %w", ErrCredentials, err)
		case cfg.Credentials == nil:
			c.err = ErrCredentials
		default:
			c.provider = cfg.Credentials
		}
	})
	if c.err != nil {
		return aws.Credentials{}, c.err
	}
	creds, err := c.provider.Retrieve(ctx)
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("%w: %w", ErrCredentials, err)
	}
	return creds, nil
}

// chatRequest is what the translation reads of a Chat Completions request.
type chatRequest struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
	Tools               json.RawMessage `json:"tools"`
	Functions           json.RawMessage `json:"functions"`
	ResponseFormat      *struct {
		Type string `json:"type"`
	} `json:"response_format"`
}

// Wire types of the Converse API (field order is the byte order sent).
type block struct {
	Text string `json:"text"`
}

type message struct {
	Role    string  `json:"role"`
	Content []block `json:"content"`
}

type inferenceConfig struct {
	MaxTokens     *int     `json:"maxTokens,omitempty"`
	Temperature   *float64 `json:"temperature,omitempty"`
	TopP          *float64 `json:"topP,omitempty"`
	StopSequences []string `json:"stopSequences,omitempty"`
}

type converseRequest struct {
	Messages        []message        `json:"messages"`
	System          []block          `json:"system,omitempty"`
	InferenceConfig *inferenceConfig `json:"inferenceConfig,omitempty"`
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: bedrock: %s", dialect.ErrBadRequest, fmt.Sprintf(format, args...))
}

// present reports whether a raw member was sent with a value.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// Translate turns a Chat Completions request body into a Converse request body.
func Translate(body []byte) ([]byte, error) {
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return nil, bad("the request is not a chat request: %v", err)
	}
	switch {
	case present(cr.Tools), present(cr.Functions):
		return nil, bad("tools are not translated")
	case cr.N != nil && *cr.N != 1:
		return nil, bad("n must be 1")
	case cr.ResponseFormat != nil && cr.ResponseFormat.Type != "" && cr.ResponseFormat.Type != "text":
		return nil, bad("response_format %q is not translated", cr.ResponseFormat.Type)
	}
	var req converseRequest
	for i, m := range cr.Messages {
		texts, err := texts(m.Content)
		if err != nil {
			return nil, bad("messages[%d]: %v", i, err)
		}
		switch m.Role {
		case "system", "developer":
			req.System = append(req.System, texts...)
		case "user", "assistant":
			if len(texts) == 0 {
				continue // Bedrock refuses a blank text block; an empty turn says nothing
			}
			if n := len(req.Messages); n > 0 && req.Messages[n-1].Role == m.Role {
				req.Messages[n-1].Content = append(req.Messages[n-1].Content, texts...) // Converse alternates roles
				continue
			}
			req.Messages = append(req.Messages, message{Role: m.Role, Content: texts})
		default:
			return nil, bad("messages[%d]: role %q is not translated", i, m.Role)
		}
	}
	if len(req.Messages) == 0 || req.Messages[0].Role != "user" {
		return nil, bad("messages must hold a user turn first (after any system messages)")
	}
	ic := inferenceConfig{MaxTokens: cr.MaxCompletionTokens, Temperature: cr.Temperature, TopP: cr.TopP}
	if ic.MaxTokens == nil {
		ic.MaxTokens = cr.MaxTokens
	}
	if present(cr.Stop) {
		var one string
		if json.Unmarshal(cr.Stop, &one) == nil {
			ic.StopSequences = []string{one}
		} else if err := json.Unmarshal(cr.Stop, &ic.StopSequences); err != nil {
			return nil, bad("stop must be a string or an array of strings")
		}
	}
	if ic.MaxTokens != nil || ic.Temperature != nil || ic.TopP != nil || len(ic.StopSequences) > 0 {
		req.InferenceConfig = &ic
	}
	return json.Marshal(req)
}

// texts is a message's content as text blocks (blank texts left out): a string, or text parts.
func texts(raw json.RawMessage) ([]block, error) {
	if !present(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if strings.TrimSpace(s) == "" {
			return nil, nil
		}
		return []block{{Text: s}}, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, errors.New("content must be a string or an array of parts")
	}
	var out []block
	for _, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return nil, fmt.Errorf("content part of type %q is not translated", p.Type)
		}
		if strings.TrimSpace(*p.Text) != "" {
			out = append(out, block{Text: *p.Text})
		}
	}
	return out, nil
}

// Path is the Converse (stream: ConverseStream) path of model id, the id escaped as the SDK
// escapes a path label (a ':' or '/' of an id or an ARN included).
func Path(modelID string, stream bool) string {
	op := "/converse"
	if stream {
		op = "/converse-stream"
	}
	return "/model/" + escapeLabel(modelID) + op
}

// escapeLabel escapes everything but RFC 3986's unreserved characters.
func escapeLabel(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// Prepare translates the request and signs it for the backend's region.
func (d Dialect) Prepare(req dialect.Request, b config.Backend) (dialect.Upstream, error) {
	body, err := Translate(req.Body)
	if err != nil {
		return dialect.Upstream{}, err
	}
	path := Path(b.BedrockModelID(req.Model), req.Stream)
	h, err := d.sign(strings.TrimRight(b.BaseURL, "/")+path, body, b.BedrockRegion(), time.Now())
	if err != nil {
		return dialect.Upstream{}, err
	}
	return dialect.Upstream{Path: path, Body: body, Header: h}, nil
}

// sign is the headers that carry the SigV4 signature of a POST of body to url: Authorization,
// X-Amz-Date and, with temporary credentials, X-Amz-Security-Token. Only the host, the
// Content-Type (application/json, which the backend client sends as well) and those x-amz-
// headers are signed (and the body's SHA-256), so the headers the client adds later (Accept,
// traceparent) do not break it.
func (d Dialect) sign(url string, body []byte, region string, now time.Time) (http.Header, error) {
	creds, err := d.creds.get()
	if err != nil {
		return nil, err
	}
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("bedrock: sign: %w", err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = 0 // not signed: the body's hash is, and a proxy may re-frame it
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, r, hex.EncodeToString(sum[:]), SigningName, region, now); err != nil {
		return nil, fmt.Errorf("bedrock: sign: %w", err)
	}
	h := http.Header{}
	for k, vs := range r.Header {
		if k == "Authorization" || strings.HasPrefix(k, "X-Amz-") {
			h[k] = vs
		}
	}
	return h, nil
}

// converseResponse is what is read of a Converse answer.
type converseResponse struct {
	Output struct {
		Message *struct {
			Content []struct {
				Text *string `json:"text"`
			} `json:"content"`
		} `json:"message"`
	} `json:"output"`
	StopReason string    `json:"stopReason"`
	Usage      *awsUsage `json:"usage"`
}

// awsUsage is Converse's usage (and metadata's in a stream).
type awsUsage struct {
	InputTokens  int `json:"inputTokens"`
	OutputTokens int `json:"outputTokens"`
	TotalTokens  int `json:"totalTokens"`
}

func (u *awsUsage) usage() *dialect.Usage {
	if u == nil {
		return nil
	}
	out := &dialect.Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.TotalTokens}
	if out.TotalTokens < out.PromptTokens+out.CompletionTokens {
		out.TotalTokens = out.PromptTokens + out.CompletionTokens
	}
	return out
}

// FinishReason is Bedrock's stopReason in OpenAI's words.
func FinishReason(r string) string {
	switch r {
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "guardrail_intervened", "content_filtered":
		return "content_filter"
	case "tool_use":
		return "tool_calls"
	}
	return "stop" // end_turn, stop_sequence
}

// completionID is a chat id for a Bedrock answer (Bedrock gives none).
func completionID() string { return fmt.Sprintf("chatcmpl-bedrock-%d", time.Now().UnixNano()) }

// Answer turns a Converse answer into a chat.completion.
func (Dialect) Answer(body []byte, model string) ([]byte, *dialect.Usage, error) {
	var r converseResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, nil, fmt.Errorf("bedrock: answer: %w", err)
	}
	if r.Output.Message == nil {
		return nil, nil, errors.New("bedrock: answer: no output message")
	}
	var text strings.Builder
	for _, c := range r.Output.Message.Content {
		if c.Text != nil {
			text.WriteString(*c.Text)
		}
	}
	usage := r.Usage.usage()
	out, err := openai.Completion(completionID(), model, text.String(), FinishReason(r.StopReason), usage)
	return out, usage, err
}

// ErrorBody turns a Bedrock error body into an OpenAI one: the message kept, the exception's
// name (its __type or code, without a namespace) as the code, the type by HTTP status.
func (Dialect) ErrorBody(status int, body []byte) []byte {
	var e struct {
		Type     string `json:"__type"`
		Code     string `json:"code"`
		Message  string `json:"message"`
		MessageU string `json:"Message"`
	}
	msg, code := fmt.Sprintf("the bedrock backend failed with status %d", status), ""
	if json.Unmarshal(body, &e) == nil {
		if m := cmp.Or(e.Message, e.MessageU); m != "" {
			msg = m
		}
		code = exceptionName(cmp.Or(e.Type, e.Code))
	}
	return openaiwire.ErrorBody(msg, openaiwire.ErrorType(status), code, "")
}

// exceptionName is an error type without its namespace or URI ("com.amazon#ThrottlingException",
// "ValidationException:http://internal.amazon.com/…").
func exceptionName(t string) string {
	if i := strings.LastIndexByte(t, '#'); i >= 0 {
		t = t[i+1:]
	}
	t, _, _ = strings.Cut(t, ":")
	return t
}

// NewStream implements dialect.Dialect.
func (Dialect) NewStream(o dialect.StreamOptions) dialect.Stream {
	return &Stream{chunks: openai.Chunks{Model: o.Model}}
}

// Event names of what the Stream's event reader yields besides Bedrock's event types.
const (
	// exceptionPrefix prefixes an exception message's :exception-type.
	exceptionPrefix = "exception:"
	// errorPrefix prefixes an error message's :error-code (its :error-message is the data).
	errorPrefix = "error:"
)

// maxEventPayload bounds one event's payload (the decoder's own bound is 16 MiB).
const maxEventPayload = 1 << 20

// eventReader reads an event stream's messages with the SDK's decoder.
type eventReader struct {
	r   counter
	dec *eventstream.Decoder
}

// counter counts the bytes read, to tell the end of a stream from a message cut short.
type counter struct {
	r io.Reader
	n int
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// Events implements dialect.Framed: the body is AWS's event stream.
func (s *Stream) Events(body io.Reader) dialect.EventReader { return NewEventReader(body) }

// NewEventReader reads the messages of an event stream (a Stream's Events).
func NewEventReader(r io.Reader) dialect.EventReader {
	return &eventReader{r: counter{r: r}, dec: eventstream.NewDecoder()}
}

// NextEvent is the next message as an event: an event's :event-type with its payload, an
// exception's "exception:" + :exception-type, an error's "error:" + :error-code with its
// :error-message. At the end of the body, between messages, it returns
// openaiwire.ErrTruncated; a message cut short or failing its CRC is an error of its own.
func (e *eventReader) NextEvent() (string, []byte, error) {
	e.r.n = 0
	m, err := e.dec.Decode(&e.r, nil)
	switch {
	case err == io.EOF && e.r.n == 0:
		return "", nil, openaiwire.ErrTruncated
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "", nil, fmt.Errorf("bedrock: event stream cut inside a message: %w", io.ErrUnexpectedEOF)
	case err != nil:
		return "", nil, fmt.Errorf("bedrock: event stream: %w", err)
	case len(m.Payload) > maxEventPayload:
		return "", nil, fmt.Errorf("bedrock: event stream: a payload of %d bytes", len(m.Payload))
	}
	header := func(name string) string {
		if v := m.Headers.Get(name); v != nil {
			return v.String()
		}
		return ""
	}
	switch header(":message-type") {
	case "exception":
		return exceptionPrefix + header(":exception-type"), m.Payload, nil
	case "error":
		return errorPrefix + header(":error-code"), []byte(header(":error-message")), nil
	}
	return header(":event-type"), m.Payload, nil
}

// Stream decodes a ConverseStream answer into chat.completion.chunk frames. Bedrock has no way
// to continue a given answer: it is never continued.
type Stream struct {
	dialect.NotContinued
	chunks openai.Chunks
	usage  *dialect.Usage
	finish string
	ended  bool
}

// Opening: messageStart and contentBlockStart carry no output.
func (s *Stream) Opening(ev dialect.Event) bool {
	return ev.Name == "messageStart" || ev.Name == "contentBlockStart"
}

// streamEvent is what is read of a ConverseStream event's payload.
type streamEvent struct {
	Delta *struct {
		Text *string `json:"text"`
	} `json:"delta"`
	StopReason string    `json:"stopReason"`
	Usage      *awsUsage `json:"usage"`
	Message    string    `json:"message"`
	MessageU   string    `json:"Message"`
}

// Decode turns one event into frames: the role chunk at messageStart, a content chunk for a
// text delta, the finish chunk at messageStop and, at metadata, the usage-only chunk.
func (s *Stream) Decode(ev dialect.Event, _ *dialect.Continued) dialect.Out {
	if name, ok := strings.CutPrefix(ev.Name, errorPrefix); ok {
		return dialect.Out{Err: &dialect.EventError{Kind: ErrStreamError, Message: cmp.Or(string(ev.Data), name)}}
	}
	var e streamEvent
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return dialect.Out{Err: fmt.Errorf("%w: %s: %v", ErrStreamError, ev.Name, err)}
	}
	if name, ok := strings.CutPrefix(ev.Name, exceptionPrefix); ok {
		return dialect.Out{Err: &dialect.EventError{Kind: ErrStreamError, Message: cmp.Or(e.Message, e.MessageU, name)}}
	}
	var out dialect.Out
	if s.chunks.ID == "" {
		s.chunks.ID, s.chunks.Created = completionID(), time.Now().Unix()
		out.Frame = s.chunks.Append(out.Frame, map[string]any{"role": "assistant", "content": ""}, nil)
	}
	switch ev.Name {
	case "contentBlockDelta":
		if e.Delta != nil && e.Delta.Text != nil && *e.Delta.Text != "" {
			out.Frame = s.chunks.Append(out.Frame, map[string]any{"content": *e.Delta.Text}, nil)
			out.Token = true
		}
	case "messageStop":
		if s.finish == "" {
			s.finish = FinishReason(e.StopReason)
			out.Frame = s.chunks.Append(out.Frame, map[string]any{}, &s.finish)
		}
	case "metadata":
		if s.ended {
			break
		}
		s.ended = true
		s.usage = e.Usage.usage()
		out.Usage = s.chunks.Usage(s.usage)
	}
	return out
}

// Ended: the metadata event, Bedrock's last, was seen.
func (s *Stream) Ended() bool { return s.ended }

// Usage implements dialect.Stream.
func (s *Stream) Usage() *dialect.Usage { return s.usage }
