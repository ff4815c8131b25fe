// Package dialect is the seam between the workers and the APIs their backends speak. A
// Dialect knows one backend API: how the canonical request (the client's body, in the API the
// client called) becomes the upstream request, how the backend's stream events become the
// frames the gateway stores and replays (in the client's API), how a stream is continued
// after a break, how a non-stream answer and an error body read, and where the usage is.
//
// The dialects themselves live in the packages below this one (dialect/openai,
// dialect/anthropic, dialect/responses, dialect/gemini, dialect/azure, dialect/bedrock), and
// the table naming them all in dialect/dialects. A Registry is built once and never changed,
// so it is safe for concurrent use; a Stream belongs to one execution's relay and is not. A
// Stream reads SSE events unless it is Framed (Bedrock's binary event stream).
//
// Dialects import no room above them (workers, httpapi, intent, gateway, jobs, kv):
// internal/archtest enforces it.
package dialect

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// Client APIs: the wire format a client called, which is the format of the frames stored.
const (
	APIOpenAI    = "openai"    // Chat Completions
	APIAnthropic = "anthropic" // Messages
	APIResponses = "responses" // the OpenAI Responses API, relayed natively
)

// Errors of a dialect.
var (
	// ErrUnsupported is returned by Registry.For when no dialect serves a request of that API
	// on a backend of that type (a Gemini backend asked for an Anthropic Messages request).
	ErrUnsupported = errors.New("dialect: the backend does not speak this API")
	// ErrBadRequest wraps a canonical request a dialect cannot translate (a feature its
	// backend has no equivalent for); the message says which.
	ErrBadRequest = errors.New("dialect: request not translatable")
)

// Usage is an answer's token counts, in the gateway's terms.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	TotalTokens      int
}

// Request is the canonical request a dialect prepares for its backend.
type Request struct {
	API    string // the client's API (APIOpenAI…)
	Model  string // the route's model
	Body   []byte // the client's body, in the client's API
	Stream bool
	Header http.Header // the client's headers kept for the backend (anthropic-version…)
}

// Upstream is one HTTP request to a backend, below its base URL.
type Upstream struct {
	Path   string // with its query, e.g. "/chat/completions"
	Body   []byte
	Header http.Header
	// KeyHeader is the header the backend's API key goes in, as is ("api-key",
	// "x-goog-api-key"); "" sends it as Authorization: Bearer.
	KeyHeader string
}

// Event is one event read from a backend's SSE stream.
type Event struct {
	Name string
	Data []byte
}

// Out is what one backend event becomes.
type Out struct {
	// Frame is the SSE frame(s) the clients get, nil for none.
	Frame []byte
	// Usage is a usage frame published on its own after Frame (the OpenAI usage chunk, which
	// a client sees only when it asked for it); nil for none.
	Usage []byte
	// Token: the event carried output (counted as one token of progress).
	Token bool
	// Err: the backend reported the stream failed (an error event). The relay handles it as a
	// break of the stream: Frame is not relayed, and nothing after it is read. An error event
	// that carries the backend's message is an *EventError.
	Err error
}

// EventError is an Out.Err for a backend's in-stream error event: Kind is the dialect's
// sentinel (openai.ErrStreamEvent…), Message the backend's message text ("" without one). It
// reads as fmt.Errorf("%w: %s", Kind, Message) would; it is a type so that the worker can say
// the backend's message to its clients without parsing an error string.
type EventError struct {
	Kind    error
	Message string
}

func (e *EventError) Error() string {
	if e.Message == "" {
		return e.Kind.Error()
	}
	return e.Kind.Error() + ": " + e.Message
}

// Unwrap is Kind, for errors.Is.
func (e *EventError) Unwrap() error { return e.Kind }

// Continued says, to a Stream decoding a continuation, what the final metadata reports.
type Continued struct {
	First    bool // the continuation's first event
	Resumed  int  // continuations so far, this one included
	Attempts int  // the intent's attempts in all
}

// Meta is the "oncegate" member of a continued stream's final metadata: how many
// continuations it took and the attempts in all.
func (c *Continued) Meta() json.RawMessage {
	b, _ := json.Marshal(struct {
		Resumed  int `json:"resumed"`
		Attempts int `json:"attempts"`
	}{c.Resumed, c.Attempts})
	return b
}

// StreamOptions configure a Stream.
type StreamOptions struct {
	// Track keeps the stream's text and identity for a continuation (the backend has one).
	Track bool
	Model string // the route's model
}

// EventReader reads a backend stream's events one at a time. At the end of the body it
// returns openaiwire.ErrTruncated (the relay takes that as a clean end once the Stream says
// Ended, as for an SSE stream without [DONE]); any other error is a break of the stream.
type EventReader interface {
	NextEvent() (name string, data []byte, err error)
}

// Framed is a Stream whose backend does not frame its events as SSE (Bedrock's
// application/vnd.amazon.eventstream): the relay reads the answer's body with its Events.
// Every other Stream's body is read as SSE (openaiwire.EventReader).
type Framed interface {
	Events(body io.Reader) EventReader
}

// Events is the reader of a stream's body for st: st's own when it is Framed, else SSE.
func Events(st Stream, body io.Reader) EventReader {
	if f, ok := st.(Framed); ok {
		return f.Events(body)
	}
	return openaiwire.NewEventReader(body)
}

// Stream decodes one execution's backend stream (and its continuations) into frames.
type Stream interface {
	// Opening reports whether ev is an opening event, held back until the first content.
	Opening(ev Event) bool
	// Decode maps one event; c is nil unless the event belongs to a continuation.
	Decode(ev Event, c *Continued) Out
	// Ended reports whether the stream's terminal event was seen: a stream cut after it
	// ended properly (APIs without a [DONE] marker).
	Ended() bool
	// Usage is the answer's usage so far (nil when the backend reported none).
	Usage() *Usage
	// ContinuationUsage is each continuation's own usage (billed as its own attempt).
	ContinuationUsage() []Usage
	// CanContinue reports whether a broken stream can be continued on backend b.
	CanContinue(b config.Backend) bool
	// Continuation is the request body that continues the stream from the text already
	// sent; the Stream decodes the continuation's events as part of the same answer.
	Continuation(body []byte) ([]byte, error)
}

// ErrNotContinued is the Continuation error of a Stream that is never continued.
var ErrNotContinued = errors.New("dialect: a stream of this backend is not continued")

// NotContinued is the continuation side of a Stream whose backend cannot continue a given
// answer (embedded): no continuation usage, CanContinue false, Continuation ErrNotContinued.
type NotContinued struct{}

// ContinuationUsage is none.
func (NotContinued) ContinuationUsage() []Usage { return nil }

// CanContinue is false.
func (NotContinued) CanContinue(config.Backend) bool { return false }

// Continuation is never called (CanContinue is false): ErrNotContinued.
func (NotContinued) Continuation([]byte) ([]byte, error) { return nil, ErrNotContinued }

// Dialect is one backend API.
type Dialect interface {
	// Name names the dialect in logs and errors.
	Name() string
	// API is the client API whose frames it produces.
	API() string
	// BackendType is the backend type it is the dialect of; "" for every backend type no
	// dialect claims (the gateway's own wires: openai, anthropic, oncegate, mock).
	BackendType() string
	// Prepare builds the upstream request of req for backend b (errors wrap ErrBadRequest).
	Prepare(req Request, b config.Backend) (Upstream, error)
	// NewStream decodes a new stream.
	NewStream(o StreamOptions) Stream
	// Answer turns a non-stream answer's body into the client's, with its usage.
	Answer(body []byte, model string) ([]byte, *Usage, error)
	// ErrorBody turns a backend's error body (status >= 400) into the client's API.
	ErrorBody(status int, body []byte) []byte
	// GatewayError is an error of the gateway's own in the client's API.
	GatewayError(status int, code, msg string) []byte
	// StreamError is the terminal error event of a stream that broke after output.
	StreamError(msg string) []byte
	// Degraded is the route's fixed message as a normal answer of the client's API.
	Degraded(id, model, msg string) []byte
}

type key struct{ backendType, api string }

// Registry names each dialect by the backend type and client API it serves. It is built
// once and read-only after, safe for concurrent use.
type Registry struct {
	byKey   map[key]Dialect
	claimed map[string]bool // backend types some dialect is specific to
}

// NewRegistry builds a registry of ds; two dialects for one backend type and API are an
// error.
func NewRegistry(ds ...Dialect) (*Registry, error) {
	r := &Registry{byKey: map[key]Dialect{}, claimed: map[string]bool{}}
	for _, d := range ds {
		k := key{d.BackendType(), d.API()}
		if old, dup := r.byKey[k]; dup {
			return nil, fmt.Errorf("dialect: %s and %s both serve API %q on backend type %q", old.Name(), d.Name(), k.api, k.backendType)
		}
		r.byKey[k] = d
		if k.backendType != "" {
			r.claimed[k.backendType] = true
		}
	}
	return r, nil
}

// For is the dialect a request of api takes to a backend of backendType.
func (r *Registry) For(backendType, api string) (Dialect, error) {
	if d, ok := r.byKey[key{backendType, api}]; ok {
		return d, nil
	}
	if r.claimed[backendType] {
		return nil, fmt.Errorf("%w: backend type %s, API %s", ErrUnsupported, backendType, api)
	}
	if d, ok := r.byKey[key{"", api}]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("%w: API %s", ErrUnsupported, api)
}

// Client is the dialect whose frames a client of api gets (the gateway's own wire of that
// API), for what is said to the client without a backend: errors, degraded answers. Unknown
// APIs (embeddings, passthrough) get the OpenAI dialect, whose error body they use.
func (r *Registry) Client(api string) Dialect {
	if d, ok := r.byKey[key{"", api}]; ok {
		return d
	}
	return r.byKey[key{"", APIOpenAI}]
}
