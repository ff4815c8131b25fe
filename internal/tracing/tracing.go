// Package tracing carries W3C trace context (traceparent, tracestate) from a client's request
// through the job to the backend, and, when an OTLP endpoint is configured, exports spans for
// the request, the execution and each backend attempt with OpenTelemetry.
//
// Off (no endpoint), it keeps no provider and sends nothing: a client's traceparent reaches the
// backend unchanged (the W3C rule for an intermediary that does not trace), and a request that
// came without one gets a new trace id, so its log lines and its backend's can still be joined.
// A Tracer is safe for concurrent use; a nil *Tracer is off.
package tracing

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The W3C header names, lower case as the record's passed-through headers keep them.
const (
	HeaderParent = "traceparent"
	HeaderState  = "tracestate"
)

// ErrEndpoint: the configured OTLP endpoint is not an http(s) URL.
var ErrEndpoint = errors.New("tracing: otlp endpoint must be an http:// or https:// URL")

// Options configure the export.
type Options struct {
	// Endpoint is the OTLP/HTTP collector's base URL (spans go to Endpoint/v1/traces); empty:
	// tracing is off.
	Endpoint string
	// Service is the service.name resource attribute.
	Service string
	// SampleRatio samples new root traces (a client's sampled flag is honoured either way);
	// 0 means 1.
	SampleRatio float64
	// Exporter, when set, receives the spans instead of an OTLP endpoint, each as it ends
	// (tests: the SDK's tracetest.InMemoryExporter).
	Exporter sdktrace.SpanExporter
}

// Tracer starts spans, or only carries context when off.
type Tracer struct {
	tracer   trace.Tracer
	provider *sdktrace.TracerProvider // nil when off
}

// New returns a Tracer: off (no provider, no goroutine) without an endpoint.
func New(opts Options) (*Tracer, error) {
	t := &Tracer{tracer: noop.NewTracerProvider().Tracer("oncegate")}
	var processor sdktrace.SpanProcessor
	switch {
	case opts.Exporter != nil:
		processor = sdktrace.NewSimpleSpanProcessor(opts.Exporter)
	case opts.Endpoint == "":
		return t, nil
	default:
		u, err := url.Parse(opts.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: %q", ErrEndpoint, opts.Endpoint)
		}
		exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(u.JoinPath("v1", "traces").String()))
		if err != nil {
			return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
		}
		processor = sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBatchTimeout(time.Second))
	}
	ratio := opts.SampleRatio
	if ratio <= 0 {
		ratio = 1
	}
	res := resource.NewSchemaless(attribute.String("service.name", opts.Service))
	t.provider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(processor),
		sdktrace.WithResource(res), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
	t.tracer = t.provider.Tracer(scopeName, trace.WithSchemaURL(SchemaURL))
	return t, nil
}

// Enabled says whether spans are exported.
func (t *Tracer) Enabled() bool { return t != nil && t.provider != nil }

// Shutdown flushes the spans not yet exported, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if !t.Enabled() {
		return nil
	}
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// Carrier is a header map in either casing: the canonical http.Header and the record's
// lower-case passed-through headers both work.
type Carrier map[string][]string

// Get returns the first value of key.
func (c Carrier) Get(key string) string {
	if vs := c[key]; len(vs) > 0 {
		return vs[0]
	}
	if vs := http.Header(c).Values(key); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// Set replaces key's values, in the lower-case form the record keeps.
func (c Carrier) Set(key, value string) {
	delete(c, http.CanonicalHeaderKey(key))
	c[key] = []string{value}
}

// Keys lists the keys.
func (c Carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// Parse returns the span context of a traceparent (and tracestate) header value; not valid
// when traceparent is malformed (the W3C rule: then the request starts a new trace).
func Parse(traceparent, tracestate string) trace.SpanContext {
	c := Carrier{HeaderParent: {traceparent}}
	if tracestate != "" {
		c[HeaderState] = []string{tracestate}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
}

// Start begins the server span of a client request whose headers are h (a getter: Fiber's
// headers are not a map). The returned context carries it; end the span with span.End.
// Off, a request without a valid traceparent gets a new trace id, not sampled.
func (t *Tracer) Start(ctx context.Context, get func(string) string, name string) (context.Context, trace.Span) {
	sc := Parse(get(HeaderParent), get(HeaderState))
	if sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	} else if !t.Enabled() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, newRoot())
	}
	return t.start(ctx, name, trace.SpanKindServer)
}

// StartFrom begins a span whose parent is the trace context kept in h (a record's or a job's
// passed-through headers), e.g. a worker's execution of a job.
func (t *Tracer) StartFrom(ctx context.Context, h map[string][]string, name string) (context.Context, trace.Span) {
	ctx = propagation.TraceContext{}.Extract(ctx, Carrier(h))
	return t.start(ctx, name, trace.SpanKindConsumer)
}

func (t *Tracer) start(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if t == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(kind))
}

// Inject writes ctx's trace context into h (lower-case keys, as a record keeps its
// passed-through headers); it writes nothing when ctx carries none.
func Inject(ctx context.Context, h map[string][]string) {
	propagation.TraceContext{}.Inject(ctx, Carrier(h))
}

// scopeName is the instrumentation scope of oncegate's spans.
const scopeName = "github.com/oncegate/oncegate"

// SchemaURL is the semantic conventions' schema the spans follow (their gen_ai.* attributes:
// internal/genai).
const SchemaURL = "https://opentelemetry.io/schemas/1.41.0"

// StartAttempt begins the client span of one backend attempt under ctx's span, with the
// provider that span came from (none: ctx's context is kept as it is), and writes its
// traceparent into req's headers, so the backend's own trace continues the execution's. name
// is the span's name ("chat gpt-4o" for a GenAI call), attrs its attributes beside
// oncegate.backend.
func StartAttempt(ctx context.Context, backend, name string, req *http.Request, attrs ...attribute.KeyValue) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if name == "" {
		name = "backend " + backend
	}
	_, span := parent.TracerProvider().Tracer(scopeName, trace.WithSchemaURL(SchemaURL)).Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(append(attrs, attribute.String("oncegate.backend", backend))...))
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(ctx, span), propagation.HeaderCarrier(req.Header))
	return span
}

// TraceID is ctx's trace id in hex, or "" when it has none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// newRoot is a new trace's context, not sampled: a trace id for the logs and the backend.
func newRoot() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, Remote: true})
}
