// Package backend holds the provider adapters that workers call: one HTTP attempt to a
// backend's base URL (OpenAI-compatible APIs, Anthropic, any API a dialect speaks, another
// oncegate, whose idempotency status API answers whether a call is running), or to the
// built-in deterministic mock over an in-memory transport. What is sent (path, body, headers,
// the header the key goes in) was built by the caller's API dialect (package dialect); only
// embeddings and passthrough calls go as they are. One attempt at a time: the
// retry policy lives with the workers, which branch on this package's sentinel errors.
// A Client is safe for concurrent use.
package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/genai"
	"github.com/oncegate/oncegate/internal/jsonscan"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/tracing"
)

// Sentinel errors of one attempt; the worker's retry policy branches on them.
var (
	// ErrNotSent: the request was never fully written (dial refused, connect or TLS timeout,
	// write error). The backend cannot have run it: always safe to retry.
	ErrNotSent = errors.New("backend: request not sent")
	// ErrResendSafe: the request was written but got no first byte in time, and the backend
	// either deduplicates the forwarded Idempotency-Key or (type oncegate) says the call never
	// arrived. Safe to send again.
	ErrResendSafe = errors.New("backend: no first byte; safe to re-send")
	// ErrAmbiguous: the request was written and the attempt ended without an answer; the
	// backend may have run it. Never re-sent.
	ErrAmbiguous = errors.New("backend: outcome unknown after the request was written")
)

// API kinds a backend speaks.
const (
	APIOpenAI    = "openai"
	APIAnthropic = "anthropic"
	// APIResponses is the OpenAI Responses API, sent as the client wrote it to a backend that
	// speaks it (responses: native).
	APIResponses = "responses"
	// APIEmbeddings is OpenAI's POST /embeddings: the body as is, one JSON answer.
	APIEmbeddings = "embeddings"
	// APIPassthrough is a path a backend lists in its passthrough: POST to Call.Path, the
	// body and its Content-Type as is, never streamed.
	APIPassthrough = "passthrough"
)

// Call is one request to send.
type Call struct {
	// API is the request's wire format: APIEmbeddings and APIPassthrough pick their path
	// here; for any other API the caller's dialect built Path, Body and Header.
	API string
	// Path is the request's path below the base URL, with its query: a passthrough path
	// (e.g. "/images/generations") or the one a dialect built (e.g. "/chat/completions").
	Path string
	Body []byte
	// KeyHeader is the header the API key goes in, as it is ("api-key", "x-api-key"); empty
	// sends it as Authorization: Bearer.
	KeyHeader string
	Stream    bool
	// IdemKey is forwarded as Idempotency-Key (a hash of the gateway's record key, never
	// client text), so a gateway or provider that deduplicates can recognise a re-send.
	IdemKey string
	// Header holds request headers to pass through (e.g. anthropic-version, anthropic-beta).
	Header http.Header
	// Deadline bounds the attempt beyond the backend's own total timeout (the client's).
	Deadline time.Time
	// Model is the request's model (the route's), for the attempt's span (gen_ai.request.model).
	Model string
}

// Client calls one backend.
type Client struct {
	cfg       config.Backend
	baseURL   string
	apiKey    string
	http      *http.Client
	mock      *mockllm.Server
	inProcess bool // the mock: a request is "written" the moment it is handed over
}

// New builds the client for a configured backend; getenv resolves api_key_env.
func New(b config.Backend, getenv func(string) string) (*Client, error) {
	b = b.WithDefaults()
	c := &Client{cfg: b}
	switch {
	case b.Type == config.TypeMock:
		c.mock = mockllm.New(mockllm.Options{TTFT: b.Mock.TTFT.D(), InterToken: b.Mock.InterToken.D(), Tokens: b.Mock.Tokens, Models: b.Models})
		c.baseURL = "http://mock.internal/v1"
		c.http = &http.Client{Transport: c.mock.RoundTripper()}
		c.inProcess = true
	case config.IsHTTPType(b.Type): // which API it speaks is the caller's dialect's business
		c.baseURL = strings.TrimRight(b.BaseURL, "/")
		if b.APIKeyEnv != "" && getenv != nil {
			c.apiKey = getenv(b.APIKeyEnv)
		}
		connect := b.ConnectTimeout.D()
		c.http = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: connect,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   true,
		}}
	default: // config validation refuses it; a configuration that skipped it fails here
		return nil, fmt.Errorf("backend %s: unknown type %q", b.Name, b.Type)
	}
	return c, nil
}

// Name is the configured backend name.
func (c *Client) Name() string { return c.cfg.Name }

// Config is the backend's configuration with every default filled in.
func (c *Client) Config() config.Backend { return c.cfg }

// Mock is the in-process mock server behind a mock backend (nil for real providers).
func (c *Client) Mock() *mockllm.Server { return c.mock }

// Send makes one attempt. On success the caller reads and closes the body, then calls
// cancel. Errors wrap ErrNotSent, ErrResendSafe or ErrAmbiguous so the retry policy can tell
// whether the backend may have run the request. Timeouts: connect (dial and TLS), first byte
// (see ErrResendSafe), and total (the backend's timeout, or the call's deadline if sooner).
func (c *Client) Send(ctx context.Context, call *Call) (*http.Response, context.CancelFunc, error) {
	path, body, err := callPath(call)
	if err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(c.cfg.Timeout.D())
	if !call.Deadline.IsZero() && call.Deadline.Before(deadline) {
		deadline = call.Deadline
	}
	actx, cancel := context.WithDeadlineCause(ctx, deadline, ErrAmbiguous)
	stop := cancel
	watch := c.watches(call)
	var cancelCause context.CancelCauseFunc
	if watch {
		actx, cancelCause = context.WithCancelCause(actx)
		stop = func() { cancelCause(nil); cancel() }
	}

	var written atomic.Bool
	written.Store(c.inProcess)
	trace := &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				written.Store(true)
			}
		},
	}
	var firstByte chan struct{} // closed at the first byte of the answer, when watched
	var once sync.Once
	if watch {
		firstByte = make(chan struct{})
		trace.GotFirstResponseByte = func() { once.Do(func() { close(firstByte) }) }
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(actx, trace), http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("backend %s: build request: %w", c.cfg.Name, err)
	}
	c.setHeaders(req, call)
	// The attempt's span is the GenAI client span of the call: it ends when its answer's body
	// is closed (the whole stream), or with its failure. The worker adds what the answer says
	// (AttemptSpan).
	span := c.startSpan(ctx, req, call)

	waitWatch := func() {} // returns once the first-byte watch, if any, has ended
	if watch {
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			c.watchFirstByte(actx, cancelCause, firstByte, call)
		}()
		waitWatch = func() { <-watchDone }
	}
	resp, err := c.http.Do(req)
	if resp != nil && watch {
		once.Do(func() { close(firstByte) }) // the in-process transport has no trace hooks
	}
	if err != nil {
		stop()
		waitWatch()
		err = c.classify(err, written.Load(), actx)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(genai.ErrorType.String(errorType(err)))
		span.End()
		return nil, nil, err
	}
	waitWatch()
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetStatus(codes.Error, resp.Status)
		span.SetAttributes(genai.ErrorType.String(strconv.Itoa(resp.StatusCode)))
	}
	resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
	return resp, stop, nil
}

// startSpan begins the attempt's span: named and described by the GenAI conventions
// (gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model, server.address and
// server.port) for a generation or embeddings call, "backend {name}" for a passthrough.
func (c *Client) startSpan(ctx context.Context, req *http.Request, call *Call) trace.Span {
	op := genai.Operation(call.API)
	if op == "" {
		return tracing.StartAttempt(ctx, c.cfg.Name, "", req)
	}
	attrs := []attribute.KeyValue{genai.OperationName.String(op), genai.ProviderName.String(genai.Provider(c.cfg.Type))}
	if call.Model != "" {
		attrs = append(attrs, genai.RequestModel.String(call.Model))
	}
	if host, port, ok := genai.Server(c.cfg.BaseURL); ok && !c.inProcess {
		attrs = append(attrs, genai.ServerAddress.String(host), genai.ServerPort.Int(port))
	}
	return tracing.StartAttempt(ctx, c.cfg.Name, genai.SpanName(op, call.Model), req, attrs...)
}

// errorType is the error.type of an attempt that got no answer.
func errorType(err error) string {
	switch {
	case errors.Is(err, ErrNotSent), errors.Is(err, ErrResendSafe):
		return "unreachable"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrAmbiguous):
		return "timeout"
	}
	return "_OTHER"
}

// spanBody ends the attempt's span when the answer's body is closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.span.End() })
	return err
}

// AttemptSpan is the span of the attempt whose answer's body is body (a non-recording span
// for a body Send did not return), for the worker to add what the answer says before it
// closes the body.
func AttemptSpan(body io.ReadCloser) trace.Span {
	if b, ok := body.(*spanBody); ok {
		return b.span
	}
	return trace.SpanFromContext(context.Background())
}

func (c *Client) setHeaders(req *http.Request, call *Call) {
	for k, vs := range call.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if call.API != APIPassthrough || req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	switch {
	case call.API == APIPassthrough: // the client's Accept, if it was passed through
	case call.Stream:
		req.Header.Set("Accept", "text/event-stream")
	default:
		req.Header.Set("Accept", "application/json")
	}
	if call.IdemKey != "" && (c.cfg.Type == config.TypeOncegate || c.cfg.HonorsIdempotencyKey) {
		req.Header.Set("Idempotency-Key", call.IdemKey)
	}
	switch {
	case c.apiKey == "":
	case call.KeyHeader != "":
		req.Header.Set(call.KeyHeader, c.apiKey)
	default:
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
}

// callPath is the path and the body a call sends: embeddings go to /embeddings as they are;
// a passthrough and a dialect's request to the path they name.
func callPath(call *Call) (string, []byte, error) {
	if call.API == APIEmbeddings {
		return "/embeddings", call.Body, nil
	}
	if !strings.HasPrefix(call.Path, "/") {
		return "", nil, fmt.Errorf("backend: %s path %q is not absolute", call.API, call.Path)
	}
	return call.Path, call.Body, nil
}

// watches reports whether a written call left without a first byte can become re-sendable
// (watchFirstByte): only when the backend deduplicates the forwarded key or is another oncegate.
// Any other call just waits up to its total timeout, and no watch is started for it.
func (c *Client) watches(call *Call) bool {
	return call.IdemKey != "" && (c.cfg.HonorsIdempotencyKey || c.cfg.Type == config.TypeOncegate)
}

// watchFirstByte decides what a written request without a first byte becomes: re-sendable
// when the backend deduplicates the key or (oncegate) says it never got the call; otherwise
// the attempt keeps waiting up to its total timeout.
func (c *Client) watchFirstByte(ctx context.Context, cancel context.CancelCauseFunc, firstByte <-chan struct{}, call *Call) {
	t := time.NewTimer(c.cfg.FirstByteTimeout.D())
	defer t.Stop()
	// stillSilent waits for the timer; false once the first byte came or the attempt ended.
	stillSilent := func() bool {
		select {
		case <-firstByte:
			return false
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	if !stillSilent() {
		return
	}
	switch {
	case c.cfg.HonorsIdempotencyKey && call.IdemKey != "":
		cancel(ErrResendSafe)
	case c.cfg.Type == config.TypeOncegate && call.IdemKey != "":
		for {
			state, err := c.upstreamState(ctx, call.IdemKey)
			if err == nil && state == "" { // the upstream has no record: the call never arrived
				cancel(ErrResendSafe)
				return
			}
			// Running (or unknown): keep waiting, and ask again later.
			t.Reset(c.cfg.FirstByteTimeout.D())
			if !stillSilent() {
				return
			}
		}
	}
}

// upstreamState asks another oncegate for the state of a key: "" when it has none.
func (c *Client) upstreamState(ctx context.Context, key string) (string, error) {
	qctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout.D()+2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(qctx, http.MethodGet, c.baseURL+"/idempotency/"+url.PathEscape(key), nil)
	if err != nil {
		return "", err
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return "", nil
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("backend %s: idempotency status %d", c.cfg.Name, resp.StatusCode)
	}
	var st struct {
		State string `json:"state"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return "", err
	}
	return st.State, nil
}

// classify maps a failed attempt to what the retry policy needs to know.
func (c *Client) classify(err error, written bool, actx context.Context) error {
	if cause := context.Cause(actx); errors.Is(cause, ErrResendSafe) {
		return fmt.Errorf("backend %s: %w", c.cfg.Name, ErrResendSafe)
	}
	if !written {
		return fmt.Errorf("backend %s: %w: %w", c.cfg.Name, ErrNotSent, err)
	}
	return fmt.Errorf("backend %s: %w: %w", c.cfg.Name, ErrAmbiguous, err)
}

// PrepareBody sets the request's transport fields for the execution mode: "stream" as given,
// and for a stream stream_options.include_usage (the gateway bills from usage); a non-stream
// request carries no stream_options (vLLM rejects them). Other fields are kept as sent; the
// body is returned unchanged when it already fits.
func PrepareBody(body []byte, stream bool) ([]byte, error) { return prepareStream(body, stream, true) }

// PrepareAnthropicBody sets "stream" for the execution's mode (Anthropic reports usage in
// message_start and message_delta on its own, so nothing else is added).
func PrepareAnthropicBody(body []byte, stream bool) ([]byte, error) {
	return prepareStream(body, stream, false)
}

// prepareStream sets "stream", and with openAI also stream_options as PrepareBody says.
func prepareStream(body []byte, stream, openAI bool) ([]byte, error) {
	probe, err := probeStream(body)
	if err != nil {
		return nil, err
	}
	var options map[string]json.RawMessage // OpenAI's stream_options
	if openAI && len(probe.StreamOptions) > 0 {
		if err := json.Unmarshal(probe.StreamOptions, &options); err != nil {
			return nil, fmt.Errorf("backend: request body: stream_options: %w", err)
		}
	}
	streamOK := (probe.Stream != nil && *probe.Stream == stream) || (probe.Stream == nil && !stream)
	usageOK := !openAI || (stream && string(options["include_usage"]) == "true") || (!stream && options == nil)
	if streamOK && usageOK {
		return body, nil
	}
	// Rewrite: the other members as they are (the last of duplicate keys, as a decoder keeps),
	// then the stream fields this execution needs.
	rewritten := func(key string) bool { return key == "stream" || openAI && key == "stream_options" }
	keys := probe.names
	last := make(map[string]int, len(keys))
	for i, k := range keys {
		last[k] = i
	}
	out := make([]byte, 0, len(body)+64)
	out = append(out, '{')
	for i, m := range probe.members {
		if last[keys[i]] != i || rewritten(keys[i]) {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(append(append(out, m.Key...), ':'), m.Value...)
	}
	if stream {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, `"stream":true`...)
		if openAI {
			if options == nil {
				options = map[string]json.RawMessage{}
			}
			options["include_usage"] = json.RawMessage("true")
			opts, _ := json.Marshal(options) // raw messages from a decoded object always encode
			out = append(append(out, `,"stream_options":`...), opts...)
		}
	}
	return append(out, '}'), nil
}

// streamProbe is what prepareStream needs to know of a body.
type streamProbe struct {
	Stream        *bool
	StreamOptions json.RawMessage
	members       []jsonscan.Member // the body's top-level members
	names         []string          // their decoded keys
}

// probeStream reads "stream" and "stream_options" from body as json.Unmarshal into
// streamProbe's fields tagged with those names would (keys matched case-insensitively, the
// last match wins), but crosses the rest of the body, a prompt of up to megabytes, with
// jsonscan: one fast pass instead of encoding/json's validation and decoding passes.
func probeStream(body []byte) (streamProbe, error) {
	var p streamProbe
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		return p, ErrBodyNotObject
	}
	members, err := jsonscan.Object(body)
	if err != nil {
		return p, fmt.Errorf("backend: request body: %w", err)
	}
	p.members, p.names = members, make([]string, len(members))
	for i, m := range members {
		key := m.Name()
		p.names[i] = key
		switch {
		case strings.EqualFold(key, "stream"):
			var b *bool
			if err := json.Unmarshal(m.Value, &b); err != nil {
				return p, fmt.Errorf("backend: request body: stream: %w", err)
			}
			p.Stream = b
		case strings.EqualFold(key, "stream_options"):
			p.StreamOptions = m.Value
		}
	}
	return p, nil
}

// ErrBodyNotObject is returned for a request body that is valid JSON but not an object
// (null, an array, a number): there is no field to set on it.
var ErrBodyNotObject = errors.New("backend: request body is not a JSON object")
