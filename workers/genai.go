package workers

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/internal/genai"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/kv"
)

// An execution is one GenAI client operation in the OpenTelemetry conventions (internal/genai):
// its span and the span of the attempt that answered carry the gen_ai.* attributes, and its end
// is recorded in the GenAI client histograms. Copies of the intent (joined, replayed) make no
// operation: their request spans say so (oncegate.outcome), and they add nothing to the
// histograms, so tools that sum gen_ai.client.token.usage see each intent's tokens once.

// genAIProvider is the gen_ai.provider.name of the backend that answered, else of the route's
// first.
func (ex *execution) genAIProvider() string {
	if b, ok := ex.pool.opts.Backends[ex.answeredBy()]; ok {
		return genai.Provider(b.Config().Type)
	}
	return genai.ProviderOpenAI
}

// answerAttributes are the gen_ai.* attributes of an answer (stream: its frames; else its
// body) with usage u (nil: none reported), and with content capture the output messages.
func (ex *execution) answerAttributes(stream bool, out []byte, u *kv.Usage) []attribute.KeyValue {
	r := genai.ReadResponse(stream, out, ex.pool.opts.CaptureContent)
	var attrs []attribute.KeyValue
	if r.Model != "" {
		attrs = append(attrs, genai.ResponseModel.String(r.Model))
	}
	if r.ID != "" {
		attrs = append(attrs, genai.ResponseID.String(r.ID))
	}
	if len(r.FinishReasons) > 0 {
		attrs = append(attrs, genai.FinishReasons.StringSlice(r.FinishReasons))
	}
	if u != nil {
		attrs = append(attrs, genai.InputTokens.Int(u.PromptTokens), genai.OutputTokens.Int(u.CompletionTokens))
	}
	if ex.pool.opts.CaptureContent {
		attrs = append(attrs, genai.OutputMessages.String(genai.Output(r)))
	}
	return attrs
}

// annotateAttempt adds what an answer says to the span of the attempt that gave it (see
// backend.AttemptSpan), before its body is closed.
func (ex *execution) annotateAttempt(span trace.Span, stream bool, out []byte, u *dialect.Usage) {
	if !span.IsRecording() || genai.Operation(ex.api()) == "" {
		return
	}
	span.SetAttributes(ex.answerAttributes(stream, out, kvUsage(u))...)
}

// startGenAI marks the operation's start (its first attempt) and describes it on the
// execution's span in ctx.
func (ex *execution) startGenAI(ctx context.Context) {
	ex.began = time.Now()
	span := trace.SpanFromContext(ctx)
	op := genai.Operation(ex.api())
	if !span.IsRecording() || op == "" {
		return
	}
	span.SetAttributes(genai.OperationName.String(op), genai.RequestModel.String(ex.job.Model),
		attribute.String("oncegate.idem_key_hash", ex.job.Key), attribute.Bool("oncegate.stream", ex.job.Stream))
	if ex.pool.opts.CaptureContent {
		msgs, system := genai.Input(ex.job.Body)
		if msgs != "" {
			span.SetAttributes(genai.InputMessages.String(msgs))
		}
		if system != "" {
			span.SetAttributes(genai.SystemInstructions.String(system))
		}
	}
}

// finishGenAI describes the stored outcome on the execution's span and records the operation
// in the GenAI histograms; once per execution, when its outcome was stored.
func (ex *execution) finishGenAI(ctx context.Context, state kv.State, res *kv.Result) {
	op := genai.Operation(ex.api())
	if ex.began.IsZero() || op == "" || ex.observed {
		return
	}
	ex.observed = true
	errType := ex.genAIErrorType(state, res)
	usage := totalUsage(res)
	provider := ex.genAIProvider()
	call := telemetry.GenAICall{Operation: op, Provider: provider, Model: ex.job.Model, ErrorType: errType,
		Duration: time.Since(ex.began), Usage: usage != nil}
	if usage != nil {
		call.InputTokens, call.OutputTokens = usage.PromptTokens, usage.CompletionTokens
	}
	if ex.job.Stream && !ex.firstChunk.IsZero() {
		call.FirstChunk = ex.firstChunk.Sub(ex.began)
	}
	ex.pool.opts.Metrics.GenAI(call)

	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(genai.ProviderName.String(provider), attribute.String("oncegate.outcome", string(state)),
		attribute.String("oncegate.backend", ex.answeredBy()), attribute.Int("oncegate.attempts", ex.earlier+ex.attempts))
	if res.Status == http.StatusOK && (state == kv.Completed || res.Partial) {
		out := res.Body
		if ex.job.Stream {
			out = res.Events
		}
		span.SetAttributes(ex.answerAttributes(ex.job.Stream, out, usage)...)
	}
	if errType != "" {
		span.SetAttributes(genai.ErrorType.String(errType))
		span.SetStatus(codes.Error, "the execution ended with "+errType)
	}
}

// genAIErrorType is the error.type of an outcome: "" for an answer, else the class of failure.
func (ex *execution) genAIErrorType(state kv.State, res *kv.Result) string {
	switch {
	case state == kv.Completed && res.Status == http.StatusOK:
		return ""
	case res.Partial:
		return telemetry.GenAIErrTruncated
	case ex.degraded:
		return telemetry.GenAIErrUnavailable
	case ex.ambiguous > 0 && res.Status == http.StatusGatewayTimeout:
		return telemetry.GenAIErrTimeout
	case state == kv.Failed && ex.backend == "" && res.Status == http.StatusBadGateway:
		return telemetry.GenAIErrUnreachable
	}
	return strconv.Itoa(res.Status)
}

// totalUsage is the outcome's usage with its continuations' (nil when none was reported).
func totalUsage(res *kv.Result) *kv.Usage {
	if res.Usage == nil && len(res.ContinuationUsage) == 0 {
		return nil
	}
	var u kv.Usage
	if res.Usage != nil {
		u = *res.Usage
	}
	for _, c := range res.ContinuationUsage {
		u.PromptTokens += c.PromptTokens
		u.CompletionTokens += c.CompletionTokens
		u.TotalTokens += c.TotalTokens
	}
	return &u
}
