package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/oncegate/oncegate/effects"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/anthropicwire"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/ledger"
)

// apiError is what the client sees for an error: a status, the fields of the body (rendered
// in the route's provider format) and the retry advice the SDKs obey.
type apiError struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	Retry   retryAdvice
	// RetryAfter is in seconds (Retry-After and retry-after-ms); 0 = none.
	RetryAfter int
}

func (e *apiError) Error() string { return e.Message }

// ptr is a copy of e to return as an error (a row of the table is never handed out itself).
func (e apiError) ptr() *apiError { return &e }

// body is the error body in the OpenAI or the Anthropic format.
func (e *apiError) body(anthropic bool) []byte {
	if anthropic {
		return anthropicwire.ErrorBody(anthropicwire.ErrorType(e.Status), e.Message)
	}
	return openaiwire.ErrorBody(e.Message, e.Type, e.Code, e.Param)
}

// retryAdvice is the x-should-retry header, which the official SDKs obey over the status code.
type retryAdvice int8

const (
	retryUnsaid retryAdvice = iota // no header: the SDK decides by the status
	retryNo
	retryYes
)

func retryIf(ok bool) retryAdvice {
	if ok {
		return retryYes
	}
	return retryNo
}

// Errors of this package. Each is a row of errorTable, which says what the client sees.
var (
	errUnsupportedMediaType = errors.New("httpapi: Content-Type is not application/json")
	errUnsupportedEncoding  = errors.New("httpapi: unsupported Content-Encoding")
	errBadEncoding          = errors.New("httpapi: the body does not decode as its Content-Encoding says")
	errMissingAPIKey        = errors.New("httpapi: no API key")
	errInvalidAPIKey        = errors.New("httpapi: invalid API key")
	errAdminKeyRequired     = errors.New("httpapi: no valid admin API key")
	// errAdminDisabled: no admin key or no ledger is configured, so the admin API does not exist.
	errAdminDisabled = errors.New("httpapi: the admin API is not configured")
	// errKeyInUse: a joined copy waited its MaxWait and the execution still runs.
	errKeyInUse = errors.New("httpapi: the Idempotency-Key is in use")
	// errDeadlinePassed: the client's Oncegate-Timeout passed before its answer.
	errDeadlinePassed   = errors.New("httpapi: Oncegate-Timeout passed")
	errRecordUnreadable = errors.New("httpapi: the record is not readable")
	errNoResult         = errors.New("httpapi: the record has no result")
	errStatusUnreadable = errors.New("httpapi: the status board is not readable")
	// errInternal answers any error without a row; it never quotes err.Error().
	errInternal         = errors.New("httpapi: internal error")
	errUnknownURL       = errors.New("httpapi: unknown URL")
	errMethodNotAllowed = errors.New("httpapi: method not allowed")
	errBodyTooLarge     = errors.New("httpapi: request body too large")
	errHeaderTooLarge   = errors.New("httpapi: request header too large")
	errReadTimeout      = errors.New("httpapi: request not received in time")
	// errMalformed: the request is not valid HTTP; the answer quotes nothing of it.
	errMalformed        = errors.New("httpapi: malformed HTTP request")
	errNoModel          = errors.New("httpapi: no model")
	errNoMessages       = errors.New("httpapi: no messages")
	errNoMaxTokens      = errors.New("httpapi: no max_tokens")
	errStreamNotBool    = errors.New("httpapi: stream is not a boolean")
	errBadTimeout       = errors.New("httpapi: invalid Oncegate-Timeout")
	errBadLastEventID   = errors.New("httpapi: invalid Last-Event-ID")
	errBadStartingAfter = errors.New("httpapi: invalid starting_after")
	errBadFrom          = errors.New("httpapi: invalid from")
	errBadTo            = errors.New("httpapi: invalid to")
	errToBeforeFrom     = errors.New("httpapi: to is not after from")
	errBadPeriod        = errors.New("httpapi: invalid period")
	errKeyNotPathText   = errors.New("httpapi: key is not URL path text")
	// errNoEvents: the job is not a generation (embeddings, passthrough): it has no events.
	errNoEvents = errors.New("httpapi: the job has no events")
	// errDashboardLoopback: no tenants are configured and the dashboard is not public, so only a
	// loopback client may open it.
	errDashboardLoopback = errors.New("httpapi: the dashboard is served to loopback clients only")
	// errDashboardOff: this process has no dashboard hub.
	errDashboardOff = errors.New("httpapi: the dashboard is not configured")
	// Errors carried in a record's or a stream's body (under the record's status, or a 200).
	errExecutionFailed = errors.New("httpapi: the execution failed")
	errJobCancelled    = errors.New("httpapi: the job was cancelled")
	errRestarted       = errors.New("httpapi: the execution restarted")
	errStreamCut       = errors.New("httpapi: the stream was interrupted")
	// errRecovering: the node is restoring its message store at start (Recovering answers).
	errRecovering = errors.New("httpapi: the message store is being restored")
)

const (
	typeInvalid = "invalid_request_error"
	typeServer  = "server_error"
	// resumeHint ends the message of a stream that cannot be completed on this connection.
	resumeHint = "; retry with the same Idempotency-Key to receive the complete answer"
)

func invalid(status int, code, param, msg string) apiError {
	return apiError{Status: status, Type: typeInvalid, Code: code, Param: param, Message: msg}
}

func badRequest(code, param, msg string) apiError {
	return invalid(http.StatusBadRequest, code, param, msg)
}

func notFound(msg string) apiError { return invalid(http.StatusNotFound, "not_found", "", msg) }

func unavailableAnswer(msg string) apiError {
	return apiError{Status: http.StatusServiceUnavailable, Type: typeServer, Code: "unavailable", Message: msg, Retry: retryYes, RetryAfter: 1}
}

// errorTable is the one mapping from errors (the rooms' sentinels and this package's) to what
// the client sees. Rows are matched with errors.Is, in order; nothing changes a row.
var errorTable = []struct {
	err    error
	answer apiError
}{
	{intent.ErrKeyReused, apiError{Status: http.StatusUnprocessableEntity, Type: typeInvalid, Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was already used with a different request body", Retry: retryNo}},
	{intent.ErrKeyForeign, apiError{Status: http.StatusUnprocessableEntity, Type: typeInvalid, Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was used with a different request", Retry: retryNo}},
	// Below the limit, the request's estimate does not fit in what remains: budgetAnswer says
	// how it was sized and the max_tokens that fits. Before ErrBudgetExceeded, which it matches.
	{ledger.ErrBudgetNoFit, apiError{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "budget_insufficient",
		Message: "this request's estimated cost does not fit in what remains of this tenant's spend limit for the period; set max_tokens lower",
		Retry:   retryNo}},
	{ledger.ErrBudgetExceeded, apiError{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "budget_exceeded",
		Message: "this tenant's spend limit for the period is reached", Retry: retryNo}},
	{ledger.ErrBudgetUnavailable, unavailableAnswer("the budget could not be checked; retry")},
	// A tenant's cap (intent.LimitError): limitAnswer fills in which cap and when to retry.
	{intent.ErrTenantLimit, apiError{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
		Message: "this tenant's limit is reached; retry shortly", Retry: retryYes, RetryAfter: 1}},
	// Shed at the door: nothing was written, the same request is safe to send again.
	{intent.ErrOverloaded, apiError{Status: http.StatusServiceUnavailable, Type: typeServer, Code: "overloaded",
		Message: "the gateway is at capacity; retry shortly", Retry: retryYes, RetryAfter: 1}},
	{intent.ErrContended, unavailableAnswer("the idempotency key is contended; retry")},
	{intent.ErrHistoryLost, unavailableAnswer("this execution's early output is no longer retained; retry once it has finished")},
	{intent.ErrInterrupted, unavailableAnswer("the execution was interrupted; retry")},
	{intent.ErrJobChanging, unavailableAnswer("the job is changing; retry")},
	// NATS kept failing through the whole retry window (a leader election longer than it, a
	// lost quorum): nothing was decided, and nothing this request wrote will execute later
	// (kv.Record.AdmitBy), so the same request is safe to send again. The message holds for a
	// request with or without an Idempotency-Key. kv.ErrUnavailable and jobs.ErrUnavailable
	// are this error.
	{jsretry.ErrUnavailable, apiError{Status: http.StatusServiceUnavailable, Type: typeServer, Code: "store_unavailable",
		Message: "the gateway's message store (NATS JetStream) is unavailable; nothing was decided for this request, and sending it again is safe",
		Retry:   retryYes, RetryAfter: 2}},
	// Answered before the store is open: nothing of the request was kept.
	{errRecovering, apiError{Status: http.StatusServiceUnavailable, Type: typeServer, Code: "store_unavailable",
		Message: "this node is restoring its message store after a restart; nothing of this request was stored or run: retry",
		Retry:   retryYes, RetryAfter: recoveringRetryAfter}},
	// The effects API (effects.go): a holder's write or a claim the ledger refused.
	{effects.ErrFingerprint, apiError{Status: http.StatusUnprocessableEntity, Type: typeInvalid, Code: "effect_arguments_changed", Retry: retryNo,
		Message: "this effect was claimed with other arguments (another fingerprint); an effect's name stands for one call with one set of arguments"}},
	{effects.ErrStaleFence, apiError{Status: http.StatusConflict, Type: typeInvalid, Code: "effect_stale_fence", Retry: retryNo,
		Message: "this fence no longer holds the effect: its lease ran out and another claim took it over; claim it again to see where it stands"}},
	{effects.ErrCompleted, apiError{Status: http.StatusConflict, Type: typeInvalid, Code: "effect_completed", Retry: retryNo,
		Message: "the effect is already completed (with another result, for a completion); claim it to read its result"}},
	{effects.ErrNotClaimed, apiError{Status: http.StatusConflict, Type: typeInvalid, Code: "effect_not_claimed", Retry: retryNo,
		Message: "the effect is not claimed by this fence's holder any more (released, or needing reconciliation); claim it to see where it stands"}},
	{effects.ErrNotFound, invalid(http.StatusNotFound, "effect_not_found", "", "this effect was never claimed under this Idempotency-Key (or its record expired)")},
	{intent.ErrNoJob, notFound("no such job")},
	{intent.ErrNoRecord, notFound("no record for this Idempotency-Key")},

	{errUnsupportedMediaType, invalid(http.StatusUnsupportedMediaType, "unsupported_media_type", "", "Content-Type must be application/json")},
	{errUnsupportedEncoding, invalid(http.StatusUnsupportedMediaType, "unsupported_content_encoding", "", "Content-Encoding must be identity, gzip or deflate")},
	{errBadEncoding, badRequest("invalid_content_encoding", "", "the request body does not decode as its Content-Encoding says")},
	{errMissingAPIKey, invalid(http.StatusUnauthorized, "missing_api_key", "", "an API key is required (Authorization: Bearer <key> or x-api-key)")},
	{errInvalidAPIKey, invalid(http.StatusUnauthorized, "invalid_api_key", "", "invalid API key")},
	{errAdminKeyRequired, invalid(http.StatusUnauthorized, "invalid_api_key", "", "an admin API key is required")},
	{errAdminDisabled, notFound("unknown URL")},
	{errKeyAdminBody, badRequest("invalid_request", "", `the body must be a JSON object {"tenant": "...", "sha256": "..."}`)},
	{errKeyAdminTenant, badRequest("unknown_tenant", "tenant", "no configured tenant has this id (tenants[].id)")},
	{errKeyAdminHash, badRequest("invalid_key_hash", "sha256", "a key hash is 64 lower-case hex digits (SHA-256; oncegate key hash prints one)")},
	{ErrKeyOtherTenant, invalid(http.StatusConflict, "key_conflict", "", "this API key is already another tenant's, or configured")},
	{ErrKeyWasRevoked, invalid(http.StatusConflict, "key_revoked", "", "this API key was revoked; a revoked key is never valid again")},
	{ErrKeyUnknown, notFound("no API key has this hash")},
	{errDashboardLoopback, invalid(http.StatusForbidden, "dashboard_loopback_only", "",
		"without tenants the dashboard is served to loopback clients only; start with --dashboard-public to open it")},
	{errDashboardOff, invalid(http.StatusNotFound, "unknown_url", "", "unknown URL")},
	{errKeyInUse, apiError{Status: http.StatusConflict, Type: typeInvalid, Code: "idempotency_key_in_use",
		Message: "a request with this Idempotency-Key is still in progress; retry shortly", Retry: retryYes, RetryAfter: 1}},
	// The deadline is this client's, not the intent's outcome: nothing is stored, the execution
	// goes on (a copy sent later joins it or gets its result), so a later call with the same key
	// is safe. x-should-retry is false all the same: the client chose to stop waiting here, and
	// an SDK that re-sent at once would only wait again; when to come back is the client's call.
	{errDeadlinePassed, apiError{Status: http.StatusGatewayTimeout, Type: "timeout_error", Code: "deadline_exceeded", Retry: retryNo,
		Message: "Oncegate-Timeout passed before the answer; the execution goes on, and a request with the same Idempotency-Key joins it or gets its result"}},
	{errRecordUnreadable, unavailableAnswer("the result is not readable yet; retry")},
	{errNoResult, unavailableAnswer("the result is not available yet; retry")},
	{errStatusUnreadable, unavailableAnswer("status is not readable right now")},
	{errInternal, apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error", Message: "internal error"}},

	{errUnknownURL, invalid(http.StatusNotFound, "unknown_url", "", "unknown URL")},
	{errMethodNotAllowed, invalid(http.StatusMethodNotAllowed, "method_not_allowed", "", "method not allowed for this URL")},
	{errBodyTooLarge, invalid(http.StatusRequestEntityTooLarge, "request_too_large", "", "request body exceeds the size limit")},
	{errHeaderTooLarge, invalid(http.StatusRequestHeaderFieldsTooLarge, "request_header_too_large", "", "the request header is too large")},
	{errReadTimeout, invalid(http.StatusRequestTimeout, "request_timeout", "", "the request was not received in time")},
	{errMalformed, badRequest("malformed_request", "", "the HTTP request is malformed")},

	{errNoModel, badRequest("missing_required_parameter", "model", "you must provide a model parameter")},
	{errNoMessages, badRequest("missing_required_parameter", "messages", "messages must be a non-empty array")},
	{errNoMaxTokens, badRequest("missing_required_parameter", "max_tokens", "max_tokens: a positive integer is required")},
	{errStreamNotBool, badRequest("invalid_type", "stream", "stream must be a boolean")},
	{errBadTimeout, badRequest("invalid_header", "Oncegate-Timeout", "Oncegate-Timeout must be a number of seconds between 0 and 86400")},
	{errBadLastEventID, badRequest("invalid_last_event_id", "", "Last-Event-ID must be an event id from this stream")},
	{errBadStartingAfter, badRequest("invalid_value", "starting_after", "starting_after must be an integer")},
	{errBadFrom, badRequest("invalid_value", "from", "from must be an RFC 3339 time")},
	{errBadTo, badRequest("invalid_value", "to", "to must be an RFC 3339 time")},
	{errToBeforeFrom, badRequest("invalid_value", "to", "to must be after from")},
	{errBadPeriod, badRequest("invalid_value", "period", "period must be YYYY-MM or YYYY-MM-DD")},
	{errKeyNotPathText, badRequest("invalid_idempotency_key", "", "the key is not valid URL path text")},
	{errEffectBody, badRequest("invalid_request", "",
		`the body must be one JSON object with this route's members only: {"fingerprint", "lease_ms", "reconciled", "claim_id"} to claim, {"fence", "result"} to complete, {"fence", "lease_ms"} to renew, {"fence"} to report`)},
	{errEffectName, badRequest("invalid_effect_name", "", "an effect's name is 1 to 128 characters: letters, digits, _ - . :")},
	{errEffectFingerprint, badRequest("missing_required_parameter", "fingerprint",
		"fingerprint is required: 1 to 256 printable ASCII characters without spaces (a hash of the effect's canonical arguments)")},
	{errEffectLease, badRequest("invalid_value", "lease_ms", "lease_ms must be an integer from 100 to 3600000, and no longer than the idempotency TTL")},
	{errEffectClaimID, badRequest("invalid_value", "claim_id", "claim_id is 1 to 64 printable ASCII characters without spaces")},
	{errEffectFence, badRequest("missing_required_parameter", "fence", "fence is required: the positive integer the claim answered")},
	{errEffectResult, badRequest("missing_required_parameter", "result", "result is required: the effect's result, any JSON value")},
	{errEffectResultSize, badRequest("invalid_value", "result", "result is larger than 512 KiB")},

	{errNoInput, badRequest("missing_required_parameter", "input", "you must provide an input parameter")},
	{errBadInput, badRequest("invalid_type", "input",
		"input must be a non-empty string, or a non-empty array of non-empty strings, of token ids, or of non-empty token-id arrays")},

	{errNoEvents, notFound("this job is not a generation and has no events; GET /v1/jobs/{id} has its result")},
	{errNoResponse, notFound("no response with this id")},
	{errPreviousResponse, badRequest("previous_response_not_found", "previous_response_id",
		"previous_response_id names no stored, completed response of this API key")},

	{errExecutionFailed, apiError{Status: http.StatusBadGateway, Type: typeServer, Code: "execution_failed", Message: "the execution failed"}},
	{errJobCancelled, invalid(http.StatusConflict, "job_cancelled", "", "the job was cancelled")},
	{errRestarted, apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: "execution_restarted",
		Message: "the execution was restarted after a worker was lost" + resumeHint}},
	{errStreamCut, apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: "stream_interrupted",
		Message: "the stream was interrupted" + resumeHint}},
}

// Answers that carry a part of the request (a field name, the model, the parse error).

func invalidJSON(err error) *apiError {
	return badRequest("invalid_json", "", "request body is not a valid JSON object: "+err.Error()).ptr()
}

func modelNotFound(model string) *apiError {
	return invalid(http.StatusNotFound, "model_not_found", "model",
		fmt.Sprintf("The model `%s` does not exist or is not served by this gateway on this API", model)).ptr()
}

// The token-limit answers name the field and never quote its value (which may be 5,000 digits).

func tokenNotInteger(name string) *apiError {
	return badRequest("invalid_type", name, fmt.Sprintf("Invalid '%s': expected an integer.", name)).ptr()
}

func tokenBelowMin(name string) *apiError {
	return badRequest("integer_below_min_value", name, fmt.Sprintf("Invalid '%s': expected a value >= 1.", name)).ptr()
}

func tokenAboveMax(name string) *apiError {
	return badRequest("integer_above_max_value", name, fmt.Sprintf("Invalid '%s': expected a value <= %d.", name, maxTokenLimit)).ptr()
}

// keyHeaderInvalid answers a malformed Idempotency-Key header: sending it again cannot help.
func keyHeaderInvalid(err error) *apiError {
	ae := keyPathInvalid(err)
	ae.Retry = retryNo
	return ae
}

// keyPathInvalid answers a malformed key in GET /v1/idempotency/{key}.
func keyPathInvalid(err error) *apiError {
	return badRequest("invalid_idempotency_key", "", err.Error()).ptr()
}

// unavailable is a 503 that says when to come back (the readiness reasons).
func unavailable(msg string) *apiError {
	return unavailableAnswer(msg).ptr()
}

// answerOf is what the client sees for err: its row of errorTable, an apiError as it is, or
// Fiber's own errors (404, 405, 413…); ok is false for anything else.
func answerOf(err error) (ae *apiError, ok bool) {
	for i := range errorTable {
		if errors.Is(err, errorTable[i].err) {
			ae := errorTable[i].answer.ptr()
			var le *intent.LimitError
			if errors.As(err, &le) {
				limitAnswer(ae, le)
			}
			var be *ledger.BudgetError
			if errors.As(err, &be) && errors.Is(err, ledger.ErrBudgetNoFit) {
				ae.Message = noFitMessage(be)
			}
			return ae, true
		}
	}
	if errors.As(err, &ae) {
		return ae, true
	}
	var fe *fiber.Error
	if errors.As(err, &fe) {
		return fiberError(fe), true
	}
	return nil, false
}

// limitAnswer says in ae which of a tenant's caps refused the request and when the same
// request can pass (Retry-After, rounded up to whole seconds); a request too large for its cap
// is not to be retried. The type is OpenAI's for rate limits: tokens or requests.
func limitAnswer(ae *apiError, le *intent.LimitError) {
	ae.Message = le.Error()
	if le.Limit == "tokens_per_minute" {
		ae.Type = "tokens"
	}
	if le.TooLarge {
		ae.Retry, ae.RetryAfter = retryNo, 0
		return
	}
	ae.RetryAfter = max(1, int((le.RetryAfter+time.Second-1)/time.Second))
}

// noFitMessage says why a request whose tenant is below its spend limit was refused (its
// estimate does not fit in what remains) and what would let it in: a max_tokens that fits, or
// the end of the requests in flight.
func noFitMessage(be *ledger.BudgetError) string {
	var b strings.Builder
	fmt.Fprintf(&b, "this request's estimated cost, %d micro-units, does not fit in what remains of this tenant's spend limit for the period: "+
		"%d of %d micro-units left", be.EstimateMicros, max(be.LimitMicros-be.SpentMicros, 0), be.LimitMicros)
	if be.ReservedMicros > 0 {
		fmt.Fprintf(&b, ", %d of them held by requests in flight", be.ReservedMicros)
	}
	b.WriteString(" (the limit is not reached).")
	switch be.OutputFrom {
	case ledger.OutputFromRecent:
		fmt.Fprintf(&b, " It sets no max_tokens, so its output is estimated at %d tokens, the most this model returned recently.", be.OutputTokens)
	case ledger.OutputFromDefault:
		fmt.Fprintf(&b, " It sets no max_tokens, so its output is estimated at %d tokens (ledger.default_max_tokens).", be.OutputTokens)
	}
	switch {
	case be.FitMaxTokens > 0:
		fmt.Fprintf(&b, " Set max_tokens (max_output_tokens on /v1/responses) to at most %d to fit.", be.FitMaxTokens)
	case be.ReservedMicros > 0:
		b.WriteString(" Retry once the requests in flight are answered.")
	case be.OutputFrom == "": // not sized by Admit: what fits is unknown
		b.WriteString(" Set max_tokens lower to fit.")
	default:
		b.WriteString(" Its input leaves no room for a single output token.")
	}
	return b.String()
}

// answer is the answer to err, the internal error's when it has none.
func answer(err error) *apiError {
	if ae, ok := answerOf(err); ok {
		return ae
	}
	ae, _ := answerOf(errInternal)
	return ae
}

// errorHandler writes every error a handler returns, by answerOf; anything without an answer
// is a 500 that does not leak err.Error().
func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	ae, ok := answerOf(err)
	if !ok {
		s.log.Error().Err(err).Str("path", c.Path()).Msg("internal error")
		ae = answer(errInternal)
	}
	return writeAPIError(c, ae)
}

// isAnthropicRoute: errors on the Anthropic Messages routes use Anthropic's format, so the
// Anthropic SDKs raise their usual exceptions; so do those of an Anthropic body on POST
// /v1/jobs (jobAPI).
func isAnthropicRoute(c *fiber.Ctx) bool {
	if c.Method() == fiber.MethodPost && strings.TrimSuffix(c.Path(), "/") == "/v1/jobs" {
		api, _ := jobAPI(c)
		return api == apiAnthropic
	}
	return strings.HasPrefix(c.Path(), "/v1/messages")
}

func writeAPIError(c *fiber.Ctx, ae *apiError) error {
	setRetryHeaders(c, ae.Retry, ae.RetryAfter)
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(ae.Status).Send(ae.body(isAnthropicRoute(c)))
}

// setRetryHeaders is the one place the retry advice is written (x-should-retry, and the delay
// in Retry-After and retry-after-ms), for an answer of the table and for an error body the
// execution produced (forwardError) alike. h is a *fiber.Ctx or a fasthttp response header.
func setRetryHeaders(h interface{ Set(key, value string) }, r retryAdvice, afterSecs int) {
	if r != retryUnsaid {
		h.Set("x-should-retry", strconv.FormatBool(r == retryYes))
	}
	if afterSecs > 0 {
		h.Set(fiber.HeaderRetryAfter, strconv.Itoa(afterSecs))
		h.Set("retry-after-ms", retryAfterMillis(afterSecs))
	}
}

// forwardError answers with an error body the execution produced (a backend's, or the
// gateway's stored in the record) under its own status, with the gateway's retry advice.
func forwardError(c *fiber.Ctx, status int, body []byte, r retryAdvice, afterSecs int) error {
	setRetryHeaders(c, r, afterSecs)
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(status).Send(body)
}

// retryAfterMillis is the retry-after-ms header for a Retry-After of secs seconds: the same
// delay in milliseconds. The OpenAI SDKs read retry-after-ms before Retry-After, so the two
// must say the same thing, or a client waits for what the header it reads says, not what the
// gateway meant.
func retryAfterMillis(secs int) string { return strconv.Itoa(secs * 1000) }

// fiberError is the answer to one of Fiber's own errors.
func fiberError(fe *fiber.Error) *apiError {
	switch fe.Code {
	case http.StatusNotFound:
		return answer(errUnknownURL)
	case http.StatusMethodNotAllowed:
		return answer(errMethodNotAllowed)
	case http.StatusRequestEntityTooLarge:
		return answer(errBodyTooLarge)
	case http.StatusRequestTimeout:
		return invalid(fe.Code, "request_timeout", "", fe.Message).ptr()
	}
	if fe.Code >= 500 {
		ae := answer(errInternal)
		ae.Status = fe.Code
		return ae
	}
	// A fixed text: a fiber.Error's message may quote the request.
	return invalid(fe.Code, "", "", strings.ToLower(http.StatusText(fe.Code))).ptr()
}

// malformedRequest is the fasthttp server's ErrorHandler: it answers a request that could not
// be read (a malformed or oversized header, a body over the limit, a read timeout) before any
// routing. The answer is fixed and echoes no request byte: fasthttp's parse errors quote the
// raw header block, Authorization included, and Fiber's own handler put that text in the body.
// A request whose header could not be parsed has no route anyone can trust, so it gets
// OpenAI's error shape; only a body over the limit (its header was read whole) gets its
// route's format, as before. fasthttp closes the connection after it.
func (s *Server) malformedRequest(ctx *fasthttp.RequestCtx, err error) {
	kind := errMalformed
	anthropic := false
	var small *fasthttp.ErrSmallBuffer
	var timeout interface{ Timeout() bool }
	var nothing fasthttp.ErrNothingRead
	switch {
	case errors.As(err, &small):
		kind = errHeaderTooLarge
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		kind = errBodyTooLarge
		anthropic = strings.HasPrefix(string(ctx.Path()), "/v1/messages")
	case errors.As(err, &timeout) && timeout.Timeout(), errors.As(err, &nothing):
		kind = errReadTimeout
	}
	ae := answer(kind)
	s.log.Debug().Int("status", ae.Status).Str("code", ae.Code).Msg("unreadable HTTP request") // never err: it quotes the request
	setRetryHeaders(&ctx.Response.Header, ae.Retry, ae.RetryAfter)
	ctx.Response.Header.SetContentType(fiber.MIMEApplicationJSON)
	ctx.SetStatusCode(ae.Status)
	ctx.SetBody(ae.body(anthropic))
}

// checkHeaders refuses what fasthttp parses but HTTP forbids: a field name that is not a token
// (RFC 9110 §5.1), or a value holding CR, LF or NUL ("invalid and dangerous", §5.5; a bare CR
// stays inside a value in fasthttp), which could otherwise reach a backend in a forwarded
// header. A bare LF anywhere in the header section, which fasthttp reads as a line end, was
// already refused by readBody (headerReceived marks it).
func checkHeaders(c *fiber.Ctx) error {
	bad := false
	c.Request().Header.VisitAll(func(k, v []byte) {
		bad = bad || !isToken(k) || bytes.ContainsAny(v, "\r\n\x00")
	})
	if bad {
		return errMalformed
	}
	return c.Next()
}

// tchar marks the bytes of an HTTP token (RFC 9110 §5.6.2).
var tchar = func() (t [256]bool) {
	for _, c := range []byte("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") {
		t[c] = true
	}
	return t
}()

func isToken(b []byte) bool {
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return len(b) > 0
}
