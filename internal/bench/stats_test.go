package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"
)

func msSeq(from, to int) []time.Duration {
	var out []time.Duration
	for i := from; i <= to; i++ {
		out = append(out, time.Duration(i)*time.Millisecond)
	}
	return out
}

func TestSummarize(t *testing.T) {
	thousand := msSeq(1, 1000)
	// Shuffle-ish: reversed input must give the same answer as sorted input.
	reversed := make([]time.Duration, len(thousand))
	for i, d := range thousand {
		reversed[len(thousand)-1-i] = d
	}
	ms := time.Millisecond
	tests := []struct {
		name string
		in   []time.Duration
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one sample", []time.Duration{7 * ms}, Summary{Count: 1, Mean: 7 * ms, P50: 7 * ms, P90: 7 * ms, P99: 7 * ms, P999: 7 * ms, Max: 7 * ms}},
		// rank(p50 of 2) = ceil(1) = 1, rank(p90 of 2) = ceil(1.8) = 2.
		{"two samples", []time.Duration{2 * ms, 1 * ms}, Summary{Count: 2, Mean: 1500 * time.Microsecond, P50: 1 * ms, P90: 2 * ms, P99: 2 * ms, P999: 2 * ms, Max: 2 * ms}},
		// rank(p) = p for 100 samples; p99.9 → ceil(99.9) = 100.
		{"1..100 ms", msSeq(1, 100), Summary{Count: 100, Mean: 50500 * time.Microsecond, P50: 50 * ms, P90: 90 * ms, P99: 99 * ms, P999: 100 * ms, Max: 100 * ms}},
		// p99.9 of 1000 samples is rank 999 exactly (no floating-point round-up to 1000).
		{"1..1000 ms reversed", reversed, Summary{Count: 1000, Mean: 500500 * time.Microsecond, P50: 500 * ms, P90: 900 * ms, P99: 990 * ms, P999: 999 * ms, Max: 1000 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summarize(tt.in); got != tt.want {
				t.Errorf("Summarize = %+v\nwant        %+v", got, tt.want)
			}
		})
	}
}

func TestPercentileEdges(t *testing.T) {
	s := msSeq(1, 10)
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{0, 1 * time.Millisecond}, {10, 1 * time.Millisecond}, {10.001, 2 * time.Millisecond}, {100, 10 * time.Millisecond}, {150, 10 * time.Millisecond}} {
		if got := Percentile(s, tt.p); got != tt.want {
			t.Errorf("Percentile(1..10ms, %g) = %s, want %s", tt.p, got, tt.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(nil) = %s, want 0", got)
	}
}

func TestRecorderSummaryKeepsSamples(t *testing.T) {
	var r Recorder
	for _, d := range []time.Duration{3, 1, 2} {
		r.Record(d)
	}
	if got := r.Summary(); got.P50 != 2 || got.Max != 3 || got.Count != 3 {
		t.Fatalf("Summary = %+v", got)
	}
	r.Record(4)
	if got := r.Summary(); got.Count != 4 || got.Max != 4 {
		t.Fatalf("after another sample: Summary = %+v", got)
	}
}

func TestSummaryJSONRoundTrip(t *testing.T) {
	in := Summary{Count: 3, Mean: 1500 * time.Microsecond, P50: time.Millisecond, P90: 2 * time.Millisecond,
		P99: 2 * time.Millisecond, P999: 2 * time.Millisecond, Max: 2500 * time.Microsecond}
	b, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"count":3,"mean_ms":1.5,"p50_ms":1,"p90_ms":2,"p99_ms":2,"p99_9_ms":2,"max_ms":2.5}`
	if string(b) != want {
		t.Fatalf("json = %s\nwant   %s", b, want)
	}
	var out Summary
	if err := out.UnmarshalJSON(b); err != nil || out != in {
		t.Fatalf("round trip = %+v, %v", out, err)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	urlErr := func(err error) error {
		return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/v1/chat/completions", Err: err}
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: err}}
	}
	tests := []struct {
		name   string
		status int
		err    error
		want   ErrorKind
	}{
		{"200", 200, nil, ""},
		{"201", 201, nil, ""},
		{"400", 400, nil, KindHTTP4xx},
		{"409 in use", 409, nil, KindHTTP4xx},
		{"429", 429, nil, KindHTTP4xx},
		{"500", 500, nil, KindHTTP5xx},
		{"503", 503, nil, KindHTTP5xx},
		{"302", 302, nil, KindHTTPOther},
		{"deadline", 0, urlErr(context.DeadlineExceeded), KindTimeout},
		{"client timeout", 0, fmt.Errorf("%w: %w", ErrClientTimeout, urlErr(context.Canceled)), KindTimeout},
		{"net timeout", 0, urlErr(timeoutErr{}), KindTimeout},
		{"os deadline", 0, opErr(os.ErrDeadlineExceeded), KindTimeout},
		{"refused", 0, urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}), KindConnRefused},
		{"reset", 0, urlErr(opErr(syscall.ECONNRESET)), KindConnReset},
		{"broken pipe", 0, urlErr(opErr(syscall.EPIPE)), KindConnReset},
		{"EOF before response", 0, urlErr(io.EOF), KindConnReset},
		{"no [DONE]", 200, fmt.Errorf("%w: stream ended after 3 chunks", ErrTruncated), KindTruncated},
		{"short body after 200", 200, fmt.Errorf("bench: reading body: %w", io.ErrUnexpectedEOF), KindTruncated},
		{"error event", 200, fmt.Errorf("%w: {\"error\":{}}", ErrStreamError), KindStreamError},
		{"canceled run", 0, urlErr(context.Canceled), KindCanceled},
		{"something else", 0, errors.New("tls: bad certificate"), KindOther},
		{"error wins over 200", 200, io.ErrUnexpectedEOF, KindTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.status, tt.err); got != tt.want {
				t.Errorf("Classify(%d, %v) = %q, want %q", tt.status, tt.err, got, tt.want)
			}
		})
	}
}
