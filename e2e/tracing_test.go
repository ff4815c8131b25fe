package e2e

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/internal/tracing"
)

const (
	traceID   = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID  = "00f067aa0ba902b7"
	clientTP  = "00-" + traceID + "-" + parentID + "-01"
	clientTS  = "vendor=opaque"
	tracedURL = "/v1/jobs/"
)

// tracedUpstream is an OpenAI-compatible upstream that keeps the trace headers of every chat
// request it gets.
type tracedUpstream struct {
	*upstream
	mu     sync.Mutex
	parent []string
	state  []string
}

func startTracedUpstream(t *testing.T) *tracedUpstream {
	tu := &tracedUpstream{}
	tu.upstream = startUpstream(t, func(_ http.ResponseWriter, r *http.Request, _ []byte, _ hit) bool {
		tu.mu.Lock()
		tu.parent = append(tu.parent, r.Header.Get("traceparent"))
		tu.state = append(tu.state, r.Header.Get("tracestate"))
		tu.mu.Unlock()
		return false
	})
	return tu
}

func (tu *tracedUpstream) got() (parents, states []string) {
	tu.mu.Lock()
	defer tu.mu.Unlock()
	return append([]string(nil), tu.parent...), append([]string(nil), tu.state...)
}

func tracedGateway(t *testing.T, otlp string) (*gatewaykit.Gateway, *tracedUpstream) {
	up := startTracedUpstream(t)
	cfg := gatewaykit.Config(t)
	cfg.Backends = append(cfg.Backends, fastRetryBackend("upstream", config.TypeOpenAI, up.base(), "oncegate-mock"))
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"upstream"}}}
	cfg.Tracing.OTLPEndpoint = otlp
	return gatewaykit.StartGateway(t, cfg), up
}

// jobTraceID is the trace_id GET /v1/jobs/{id} shows for the job of answer r.
func jobTraceID(t *testing.T, base string, r result) string {
	t.Helper()
	j := do(t, http.MethodGet, base+tracedURL+r.Header.Get("Oncegate-Job-Id"), "", nil)
	var v struct {
		TraceID string `json:"trace_id"`
	}
	if err := json.Unmarshal(j.Body, &v); err != nil || j.Status != http.StatusOK {
		t.Fatalf("GET job: %d %s (%v)", j.Status, j.Body, err)
	}
	return v.TraceID
}

// TestTraceContextReachesTheBackend: with tracing off, a client's traceparent and tracestate
// reach the backend unchanged and the job shows its trace id; a request without one gets a
// new trace, whose traceparent the backend gets and whose id the job shows; a copy joined to
// an execution does not call the backend again, whatever its own traceparent.
func TestTraceContextReachesTheBackend(t *testing.T) {
	gw, up := tracedGateway(t, "")
	first := postChat(t, gw.URL, chatBody("oncegate-mock", "trace me", ""),
		map[string]string{"Idempotency-Key": "trace-1", "traceparent": clientTP, "tracestate": clientTS})
	if first.Status != http.StatusOK {
		t.Fatalf("traced request: %d %s", first.Status, first.Body)
	}
	parents, states := up.got()
	if len(parents) != 1 || parents[0] != clientTP || states[0] != clientTS {
		t.Fatalf("the backend got traceparent %q tracestate %q, want %q and %q", parents, states, clientTP, clientTS)
	}
	if got := jobTraceID(t, gw.URL, first); got != traceID {
		t.Fatalf("the job's trace_id %q, want the client's %s", got, traceID)
	}

	other := "00-" + strings.Repeat("ab", 16) + "-" + parentID + "-01"
	again := postChat(t, gw.URL, chatBody("oncegate-mock", "trace me", ""), map[string]string{"Idempotency-Key": "trace-1", "traceparent": other})
	if again.Status != http.StatusOK || again.Header.Get("Oncegate-Idempotency") != "replayed" {
		t.Fatalf("the copy: %d %q", again.Status, again.Header.Get("Oncegate-Idempotency"))
	}
	if parents, _ = up.got(); len(parents) != 1 {
		t.Fatalf("the copy reached the backend: %d backend calls", len(parents))
	}

	plain := postChat(t, gw.URL, chatBody("oncegate-mock", "no trace sent", ""), map[string]string{"Idempotency-Key": "trace-2"})
	if plain.Status != http.StatusOK {
		t.Fatalf("untraced request: %d %s", plain.Status, plain.Body)
	}
	parents, _ = up.got()
	sc := tracing.Parse(parents[1], "")
	if !sc.IsValid() || sc.IsSampled() {
		t.Fatalf("an untraced request's backend call got traceparent %q: want a new, unsampled one", parents[1])
	}
	if got := jobTraceID(t, gw.URL, plain); got != sc.TraceID().String() {
		t.Fatalf("the job's trace_id %q, the backend's traceparent %q", got, parents[1])
	}
}

// otlpReceiver is an OTLP/HTTP collector on 127.0.0.1 that keeps every span it is sent.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	o := &otlpReceiver{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		o.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				o.spans = append(o.spans, ss.Spans...)
			}
		}
		o.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *otlpReceiver) byKind(kind tracepb.Span_SpanKind) []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range o.spans {
		if s.Kind == kind {
			out = append(out, s)
		}
	}
	return out
}

// TestTracesExportedOverOTLP: with an OTLP endpoint, one traced request exports the request's
// server span under the client's parent, the execution's span under it, and the backend
// attempt's client span under that, whose id is the parent the backend was sent; the GenAI
// attributes arrive over OTLP (e2e/genai_test.go checks each of them).
func TestTracesExportedOverOTLP(t *testing.T) {
	otlp := startOTLPReceiver(t)
	gw, up := tracedGateway(t, otlp.URL)
	r := postChat(t, gw.URL, chatBody("oncegate-mock", "export my trace", `"stream":true`),
		map[string]string{"Idempotency-Key": "otlp-1", "traceparent": clientTP})
	if r.Status != http.StatusOK {
		t.Fatalf("request: %d %s", r.Status, r.Body)
	}
	var server, exec, attempt *tracepb.Span
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		s, e, a := otlp.byKind(tracepb.Span_SPAN_KIND_SERVER), otlp.byKind(tracepb.Span_SPAN_KIND_CONSUMER), otlp.byKind(tracepb.Span_SPAN_KIND_CLIENT)
		if len(s) != 1 || len(e) != 1 || len(a) != 1 {
			return fmt.Errorf("spans exported: %d server, %d execution, %d attempt; want one each", len(s), len(e), len(a))
		}
		server, exec, attempt = s[0], e[0], a[0]
		return nil
	})
	for _, s := range []*tracepb.Span{server, exec, attempt} {
		if hex.EncodeToString(s.TraceId) != traceID {
			t.Errorf("span %q in trace %x, want the client's %s", s.Name, s.TraceId, traceID)
		}
	}
	if hex.EncodeToString(server.ParentSpanId) != parentID {
		t.Errorf("the request's span has parent %x, want the client's %s", server.ParentSpanId, parentID)
	}
	if string(exec.ParentSpanId) != string(server.SpanId) || string(attempt.ParentSpanId) != string(exec.SpanId) {
		t.Errorf("span parents: execution %x (request %x), attempt %x (execution %x)", exec.ParentSpanId, server.SpanId, attempt.ParentSpanId, exec.SpanId)
	}
	parents, _ := up.got()
	if want := "00-" + traceID + "-" + hex.EncodeToString(attempt.SpanId) + "-01"; len(parents) != 1 || parents[0] != want {
		t.Errorf("the backend got traceparent %q, want the attempt's %q", parents, want)
	}
	for _, s := range []*tracepb.Span{exec, attempt} {
		got := map[string]string{}
		for _, kv := range s.Attributes {
			got[kv.Key] = kv.Value.GetStringValue()
			if n, ok := kv.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				got[kv.Key] = fmt.Sprint(n.IntValue)
			}
		}
		if got["gen_ai.operation.name"] != "chat" || got["gen_ai.provider.name"] != "openai" || got["gen_ai.request.model"] != "oncegate-mock" ||
			got["gen_ai.usage.output_tokens"] == "" || got["gen_ai.usage.output_tokens"] == "0" {
			t.Errorf("span %q exported without its GenAI attributes: %v", s.Name, got)
		}
	}
}
