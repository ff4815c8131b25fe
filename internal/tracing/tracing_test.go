package tracing_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/tracing"
)

const (
	tid = "4bf92f3577b34da6a3ce929d0e0e4736"
	sid = "00f067aa0ba902b7"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		valid        bool
		sampled      bool
	}{
		{"the W3C example", "00-" + tid + "-" + sid + "-01", true, true},
		{"not sampled", "00-" + tid + "-" + sid + "-00", true, false},
		{"a later version with more fields", "01-" + tid + "-" + sid + "-01-extra", true, true},
		{"empty", "", false, false},
		{"all-zero trace id", "00-00000000000000000000000000000000-" + sid + "-01", false, false},
		{"all-zero parent id", "00-" + tid + "-0000000000000000-01", false, false},
		{"upper-case hex", "00-" + strings.ToUpper(tid) + "-" + sid + "-01", false, false},
		{"version ff", "ff-" + tid + "-" + sid + "-01", false, false},
		{"short trace id", "00-" + tid[:30] + "-" + sid + "-01", false, false},
		{"version 00 with extra fields", "00-" + tid + "-" + sid + "-01-extra", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := tracing.Parse(tc.header, "")
			if sc.IsValid() != tc.valid {
				t.Fatalf("Parse(%q) valid = %v, want %v", tc.header, sc.IsValid(), tc.valid)
			}
			if tc.valid && (sc.TraceID().String() != tid || sc.SpanID().String() != sid || sc.IsSampled() != tc.sampled) {
				t.Fatalf("Parse(%q) = trace %s span %s sampled %v", tc.header, sc.TraceID(), sc.SpanID(), sc.IsSampled())
			}
		})
	}
}

// TestOffCarriesTheClientsContext: with no endpoint, a client's traceparent and tracestate
// go on unchanged (the parent id too: nothing here is a span), and a request without one gets
// a new trace id, not sampled.
func TestOffCarriesTheClientsContext(t *testing.T) {
	tr, err := tracing.New(tracing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Enabled() {
		t.Fatal("enabled without an endpoint")
	}
	in := map[string]string{"traceparent": "00-" + tid + "-" + sid + "-01", "tracestate": "vendor=abc"}
	ctx, span := tr.Start(context.Background(), func(h string) string { return in[h] }, "req")
	defer span.End()
	if got := tracing.TraceID(ctx); got != tid {
		t.Fatalf("trace id %q, want the client's %s", got, tid)
	}
	h := map[string][]string{}
	tracing.Inject(ctx, h)
	if h["traceparent"][0] != in["traceparent"] || h["tracestate"][0] != in["tracestate"] {
		t.Fatalf("injected %v, want the client's headers unchanged", h)
	}
	// The worker side: the record's headers are the parent; an attempt writes them on.
	wctx, wspan := tr.StartFrom(context.Background(), h, "exec")
	defer wspan.End()
	if got := tracing.TraceID(wctx); got != tid {
		t.Fatalf("worker trace id %q, want %s", got, tid)
	}

	ctx2, span2 := tr.Start(context.Background(), func(string) string { return "" }, "req")
	defer span2.End()
	h2 := map[string][]string{}
	tracing.Inject(ctx2, h2)
	sc := tracing.Parse(h2["traceparent"][0], "")
	if !sc.IsValid() || sc.IsSampled() || sc.TraceID().String() != tracing.TraceID(ctx2) {
		t.Fatalf("a request without traceparent: injected %v (valid %v sampled %v), trace id %q", h2, sc.IsValid(), sc.IsSampled(), tracing.TraceID(ctx2))
	}
	_, span3 := tr.Start(context.Background(), func(string) string { return "" }, "req")
	defer span3.End()
	if span3.SpanContext().TraceID() == sc.TraceID() {
		t.Fatal("two requests without traceparent got the same trace id")
	}
}

func TestNewRefusesABadEndpoint(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:4318", "grpc://collector:4317", "http://"} {
		if _, err := tracing.New(tracing.Options{Endpoint: ep}); !errors.Is(err, tracing.ErrEndpoint) {
			t.Errorf("New(%q): %v, want ErrEndpoint", ep, err)
		}
	}
}

// FuzzParse: any header parses without panicking, and a valid one is written on with the
// same trace and parent ids.
func FuzzParse(f *testing.F) {
	f.Add("00-"+tid+"-"+sid+"-01", "a=b")
	f.Add("01-"+tid+"-"+sid+"-00-x", "")
	f.Add("00-"+tid+"-"+sid+"-0", "")
	f.Fuzz(func(t *testing.T, header, state string) {
		sc := tracing.Parse(header, state)
		if !sc.IsValid() {
			return
		}
		tr, _ := tracing.New(tracing.Options{})
		ctx, span := tr.Start(context.Background(), func(h string) string {
			if h == "traceparent" {
				return header
			}
			return state
		}, "req")
		defer span.End()
		h := map[string][]string{}
		tracing.Inject(ctx, h)
		out := tracing.Parse(h["traceparent"][0], "")
		if out.TraceID() != sc.TraceID() || out.SpanID() != sc.SpanID() || out.IsSampled() != sc.IsSampled() {
			t.Fatalf("%q written on as %q", header, h["traceparent"][0])
		}
	})
}
