package bench

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"syscall"
	"time"
)

// Sentinel errors of the request path; [Classify] maps them to error kinds.
var (
	// ErrTruncated is returned when a stream ends (cleanly or not) before "data: [DONE]", or a
	// body ends before its Content-Length.
	ErrTruncated = errors.New("bench: response truncated")
	// ErrStreamError is returned when a 200 stream carries an error event
	// (`data: {"error": …}`), e.g. the gateway's explicit error after a broken execution.
	ErrStreamError = errors.New("bench: error event in stream")
	// ErrClientTimeout is returned when an attempt of the retry-storm client saw no byte for
	// --client-timeout.
	ErrClientTimeout = errors.New("bench: client timeout")
)

// ErrorKind names a class of failed request in reports.
type ErrorKind string

// Error kinds, from [Classify].
const (
	KindTimeout     ErrorKind = "timeout"      // --timeout, --client-timeout, or a network timeout
	KindConnRefused ErrorKind = "conn_refused" // nothing listens
	KindConnReset   ErrorKind = "conn_reset"   // the peer reset or closed the connection before a response
	KindTruncated   ErrorKind = "truncated"    // body or stream cut short (no [DONE], short body)
	KindStreamError ErrorKind = "stream_error" // an error event inside a 200 stream
	KindHTTP4xx     ErrorKind = "http_4xx"
	KindHTTP5xx     ErrorKind = "http_5xx"
	KindHTTPOther   ErrorKind = "http_other" // 1xx/3xx or a nonsense status
	KindCanceled    ErrorKind = "canceled"   // the run was interrupted
	KindOther       ErrorKind = "other"
)

// Classify returns the kind of a request outcome: "" for a success (a 2xx status and no
// error), else the error's kind, else the status class. err wins over status because a body
// that broke after a 200 is a failure.
func Classify(status int, err error) ErrorKind {
	if err != nil {
		return classifyErr(err)
	}
	switch {
	case status >= 200 && status < 300:
		return ""
	case status >= 400 && status < 500:
		return KindHTTP4xx
	case status >= 500 && status < 600:
		return KindHTTP5xx
	}
	return KindHTTPOther
}

func classifyErr(err error) ErrorKind {
	var ne net.Error
	switch {
	case errors.Is(err, ErrStreamError):
		return KindStreamError
	case errors.Is(err, ErrClientTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, os.ErrDeadlineExceeded):
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return KindConnRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return KindConnReset
	case errors.Is(err, ErrTruncated), errors.Is(err, io.ErrUnexpectedEOF):
		return KindTruncated
	case errors.Is(err, io.EOF):
		// The server closed the connection without answering.
		return KindConnReset
	case errors.As(err, &ne) && ne.Timeout():
		return KindTimeout
	}
	return KindOther
}

// Summary describes a set of durations. Percentiles are nearest-rank on the sorted samples:
// the p-th percentile is the smallest sample with at least p % of the samples at or below it.
type Summary struct {
	Count int
	Mean  time.Duration
	P50   time.Duration
	P90   time.Duration
	P99   time.Duration
	P999  time.Duration
	Max   time.Duration
}

// Summarize returns the Summary of samples; it sorts samples in place.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum float64
	for _, d := range samples {
		sum += float64(d)
	}
	return Summary{
		Count: len(samples),
		Mean:  time.Duration(math.Round(sum / float64(len(samples)))),
		P50:   Percentile(samples, 50),
		P90:   Percentile(samples, 90),
		P99:   Percentile(samples, 99),
		P999:  Percentile(samples, 99.9),
		Max:   samples[len(samples)-1],
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of sorted: the sample at
// rank ceil(p/100 · n). It is computed in integer thousandths of a percent, so p99.9 of 1000
// samples is exactly rank 999. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := int64(len(sorted))
	if n == 0 {
		return 0
	}
	q := int64(math.Round(p * 1000)) // p in thousandths of a percent: 99.9 → 99900
	q = min(max(q, 0), 100000)
	rank := (q*n + 99999) / 100000 // ceil(q·n / 100000)
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Recorder stores durations. It is not safe for concurrent use; the tally that owns it
// holds the lock.
type Recorder struct {
	samples []time.Duration
}

// Record adds one sample.
func (r *Recorder) Record(d time.Duration) { r.samples = append(r.samples, d) }

// Len is the number of samples.
func (r *Recorder) Len() int { return len(r.samples) }

// Summary summarizes the samples recorded so far (on a copy; the recorder stays usable).
func (r *Recorder) Summary() Summary { return Summarize(slices.Clone(r.samples)) }

// merge appends other's samples.
func (r *Recorder) merge(other *Recorder) { r.samples = append(r.samples, other.samples...) }

// summaryJSON is the wire form of a Summary: milliseconds as floats.
type summaryJSON struct {
	Count  int     `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p99_9_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// ms converts d to milliseconds, rounded to the microsecond.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

// MarshalJSON writes the summary in milliseconds.
func (s Summary) MarshalJSON() ([]byte, error) {
	return json.Marshal(summaryJSON{Count: s.Count, MeanMs: ms(s.Mean), P50Ms: ms(s.P50), P90Ms: ms(s.P90),
		P99Ms: ms(s.P99), P999Ms: ms(s.P999), MaxMs: ms(s.Max)})
}

// UnmarshalJSON reads the form MarshalJSON writes.
func (s *Summary) UnmarshalJSON(b []byte) error {
	var w summaryJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	d := func(v float64) time.Duration { return time.Duration(math.Round(v * 1e6)) }
	*s = Summary{Count: w.Count, Mean: d(w.MeanMs), P50: d(w.P50Ms), P90: d(w.P90Ms), P99: d(w.P99Ms),
		P999: d(w.P999Ms), Max: d(w.MaxMs)}
	return nil
}
