package telemetry

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncegate/oncegate/internal/genai"
)

// The OpenTelemetry GenAI client metrics (semantic conventions genai.SemconvVersion), as
// Prometheus histograms under the names an OpenTelemetry Prometheus exporter gives them: dots
// become underscores, a unit of seconds adds _seconds, the annotation {token} adds nothing,
// and so do the attributes (gen_ai.provider.name → gen_ai_provider_name). They have no
// oncegate_ prefix, so dashboards made for the conventions find them. The buckets are the
// conventions' advice.
var (
	genAITokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	genAIDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genAIChunkBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
)

// Label values of the GenAI metrics, bounded: the operations and providers genai names (any
// other is "_OTHER"), the configured models, and the error types below.
var (
	genAIOps       = []string{genai.OpChat, genai.OpEmbeddings, "_OTHER"}
	genAIProviders = []string{genai.ProviderOpenAI, genai.ProviderAnthropic, genai.ProviderGemini, genai.ProviderAzure,
		genai.ProviderBedrock, genai.ProviderOncegate, genai.ProviderMock, "_OTHER"}
	genAITokenTypes = []string{"input", "output"}
)

// Error types (error.type) of a GenAI operation besides a backend's HTTP status code.
const (
	GenAIErrTimeout     = "timeout"     // written, no answer in time (it may have run)
	GenAIErrUnreachable = "unreachable" // never reached a backend
	GenAIErrTruncated   = "truncated"   // the answer broke off after output
	GenAIErrUnavailable = "unavailable" // no backend was available (breaker open, degraded)
	GenAIErrOther       = "_OTHER"
)

// genAIErrors are the error.type values: "" (no error), the words above, then every status
// from 400 to 599 (genAIErrorIndex).
var genAIErrors = func() []string {
	out := []string{"", GenAIErrTimeout, GenAIErrUnreachable, GenAIErrTruncated, GenAIErrUnavailable, GenAIErrOther}
	for s := 400; s < 600; s++ {
		out = append(out, strconv.Itoa(s))
	}
	return out
}()

const genAIFirstStatus = 6 // index of "400" in genAIErrors

type genAIMetrics struct {
	tokens   cells[prometheus.Observer] // operation, provider, model, token type
	duration cells[prometheus.Observer] // operation, provider, model, error type
	ttfc     cells[prometheus.Observer] // operation, provider, model
}

func (m *Metrics) registerGenAI() {
	vec := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		m.reg.MustRegister(v)
		return v
	}
	md := m.models.values
	const op, prov, model = "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"
	m.genai.tokens = newCells(vec("gen_ai_client_token_usage", "OpenTelemetry gen_ai.client.token.usage: input and output tokens of each execution a worker finished.",
		genAITokenBuckets, op, prov, model, "gen_ai_token_type").WithLabelValues, genAIOps, genAIProviders, md, genAITokenTypes)
	m.genai.duration = newCells(vec("gen_ai_client_operation_duration_seconds", "OpenTelemetry gen_ai.client.operation.duration: each execution, from its first backend attempt to its answer.",
		genAIDurationBuckets, op, prov, model, "error_type").WithLabelValues, genAIOps, genAIProviders, md, genAIErrors)
	m.genai.ttfc = newCells(vec("gen_ai_client_operation_time_to_first_chunk_seconds", "OpenTelemetry gen_ai.client.operation.time_to_first_chunk: streamed executions, from the first backend attempt to the first output chunk.",
		genAIChunkBuckets, op, prov, model).WithLabelValues, genAIOps, genAIProviders, md)
}

// GenAICall is one GenAI operation a worker finished (an execution), in the conventions'
// terms.
type GenAICall struct {
	Operation, Provider, Model string
	// ErrorType is "" for success, a backend's HTTP status ("429"), or one of GenAIErr….
	ErrorType string
	Duration  time.Duration
	// FirstChunk is the time to the first output chunk of a stream (0: not a stream, or none).
	FirstChunk time.Duration
	// Usage: the backend reported usage, InputTokens and OutputTokens.
	Usage                     bool
	InputTokens, OutputTokens int
}

// GenAI records one finished GenAI operation in the three histograms.
func (m *Metrics) GenAI(c GenAICall) {
	if m == nil {
		return
	}
	op, prov, md := indexOf(genAIOps, c.Operation), indexOf(genAIProviders, c.Provider), m.models.index(c.Model)
	m.genai.duration.at(op, prov, md, genAIErrorIndex(c.ErrorType)).Observe(c.Duration.Seconds())
	if c.FirstChunk > 0 {
		m.genai.ttfc.at(op, prov, md).Observe(c.FirstChunk.Seconds())
	}
	if c.Usage {
		m.genai.tokens.at(op, prov, md, 0).Observe(float64(c.InputTokens))
		m.genai.tokens.at(op, prov, md, 1).Observe(float64(c.OutputTokens))
	}
}

// indexOf is v's index in values, or the last one's (_OTHER).
func indexOf(values []string, v string) int {
	for i, s := range values {
		if s == v {
			return i
		}
	}
	return len(values) - 1
}

func genAIErrorIndex(e string) int {
	if s, err := strconv.Atoi(e); err == nil && s >= 400 && s < 600 && len(e) == 3 {
		return genAIFirstStatus + s - 400
	}
	for i, v := range genAIErrors[:genAIFirstStatus] {
		if v == e {
			return i
		}
	}
	return genAIFirstStatus - 1 // _OTHER
}
