package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/anthropicwire"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/ledger"
)

// apiError is an error the client sees: a status, an OpenAI-format body, extra headers.
type apiError struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
	// ShouldRetry sets x-should-retry (which the official SDKs obey over the status code).
	ShouldRetry *bool
	RetryAfter  int // seconds; 0 = none
}

func (e *apiError) Error() string { return e.Message }

var (
	retryYes = true
	retryNo  = false
)

func badRequest(code, param, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param, Message: msg}
}

func errNotFound(msg string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: msg}
}

func unavailable(msg string) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "unavailable", Message: msg, ShouldRetry: &retryYes, RetryAfter: 1}
}

// sentinelAnswers maps the sentinel errors of the rooms below to what the client sees.
var sentinelAnswers = []struct {
	err    error
	answer *apiError
}{
	{intent.ErrKeyReused, &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was already used with a different request body", ShouldRetry: &retryNo}},
	{intent.ErrKeyForeign, &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was used with a different request", ShouldRetry: &retryNo}},
	{ledger.ErrBudgetExceeded, &apiError{Status: http.StatusTooManyRequests, Type: "insufficient_quota", Code: "budget_exceeded",
		Message: "this tenant's spend limit for the period is reached", ShouldRetry: &retryNo}},
	{intent.ErrContended, unavailable("the idempotency key is contended; retry")},
	{intent.ErrHistoryLost, unavailable("this execution's early output is no longer retained; retry once it has finished")},
	{intent.ErrInterrupted, unavailable("the execution was interrupted; retry")},
	{intent.ErrJobChanging, unavailable("the job is changing; retry")},
	{intent.ErrNoJob, errNotFound("no such job")},
	{intent.ErrNoRecord, errNotFound("no record for this Idempotency-Key")},
}

// errorHandler is the one mapping from errors to responses: apiError as is, the rooms'
// sentinels by sentinelAnswers, Fiber's own errors (404, 405, 413…) in OpenAI format, anything
// else as a 500 that does not leak err.Error().
func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	var ae *apiError
	for _, sa := range sentinelAnswers {
		if ae == nil && errors.Is(err, sa.err) {
			ae = sa.answer
		}
	}
	if ae == nil && !errors.As(err, &ae) {
		var fe *fiber.Error
		if errors.As(err, &fe) {
			ae = fiberError(fe)
		} else {
			s.log.Error().Err(err).Str("path", c.Path()).Msg("internal error")
			ae = &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error", Message: "internal error"}
		}
	}
	return writeAPIError(c, ae)
}

// isAnthropicRoute: errors on the Anthropic Messages routes use Anthropic's format, so the
// Anthropic SDKs raise their usual exceptions.
func isAnthropicRoute(c *fiber.Ctx) bool {
	return strings.HasPrefix(c.Path(), "/v1/messages")
}

func writeAPIError(c *fiber.Ctx, ae *apiError) error {
	if ae.ShouldRetry != nil {
		c.Set("x-should-retry", strconv.FormatBool(*ae.ShouldRetry))
	}
	if ae.RetryAfter > 0 {
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(ae.RetryAfter))
		c.Set("retry-after-ms", retryAfterMillis(ae.RetryAfter))
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	if isAnthropicRoute(c) {
		return c.Status(ae.Status).Send(anthropicwire.ErrorBody(anthropicwire.ErrorType(ae.Status), ae.Message))
	}
	return c.Status(ae.Status).Send(openaiwire.ErrorBody(ae.Message, ae.Type, ae.Code, ae.Param))
}

// retryAfterMillis is the retry-after-ms header for a Retry-After of secs seconds: the same
// delay in milliseconds. The OpenAI SDKs read retry-after-ms before Retry-After, so the two
// must say the same thing, or a client waits for what the header it reads says, not what the
// gateway meant. Every response that sets Retry-After sets retry-after-ms through this.
func retryAfterMillis(secs int) string { return strconv.Itoa(secs * 1000) }

func fiberError(fe *fiber.Error) *apiError {
	ae := &apiError{Status: fe.Code, Type: "invalid_request_error", Message: fe.Message}
	switch fe.Code {
	case http.StatusNotFound:
		ae.Code, ae.Message = "unknown_url", "unknown URL"
	case http.StatusMethodNotAllowed:
		ae.Code, ae.Message = "method_not_allowed", "method not allowed for this URL"
	case http.StatusRequestEntityTooLarge:
		ae.Code, ae.Message = "request_too_large", "request body exceeds the size limit"
	case http.StatusRequestTimeout:
		ae.Code = "request_timeout"
	default:
		// A fixed text: a fiber.Error's message may quote the request.
		ae.Message = strings.ToLower(http.StatusText(fe.Code))
		if fe.Code >= 500 {
			ae.Type, ae.Code, ae.Message = "server_error", "internal_error", "internal error"
		}
	}
	return ae
}

// malformedRequest is the fasthttp server's ErrorHandler: it answers a request that could not
// be read (a malformed or oversized header, a body over the limit, a read timeout) before any
// routing. The answer is fixed and echoes no request byte: fasthttp's parse errors quote the
// raw header block, Authorization included, and Fiber's own handler put that text in the body.
// A request whose header could not be parsed has no route anyone can trust, so it gets
// OpenAI's error shape; only a body over the limit (its header was read whole) gets its
// route's format, as before. fasthttp closes the connection after it.
func (s *Server) malformedRequest(ctx *fasthttp.RequestCtx, err error) {
	ae := errMalformed()
	anthropic := false
	var small *fasthttp.ErrSmallBuffer
	var timeout interface{ Timeout() bool }
	var nothing fasthttp.ErrNothingRead
	switch {
	case errors.As(err, &small):
		ae.Status, ae.Code, ae.Message = http.StatusRequestHeaderFieldsTooLarge, "request_header_too_large", "the request header is too large"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		ae.Status, ae.Code, ae.Message = http.StatusRequestEntityTooLarge, "request_too_large", "request body exceeds the size limit"
		anthropic = strings.HasPrefix(string(ctx.Path()), "/v1/messages")
	case errors.As(err, &timeout) && timeout.Timeout(), errors.As(err, &nothing):
		ae.Status, ae.Code, ae.Message = http.StatusRequestTimeout, "request_timeout", "the request was not received in time"
	}
	s.log.Debug().Int("status", ae.Status).Str("code", ae.Code).Msg("unreadable HTTP request") // never err: it quotes the request
	ctx.Response.Header.SetContentType(fiber.MIMEApplicationJSON)
	ctx.SetStatusCode(ae.Status)
	if anthropic {
		ctx.SetBody(anthropicwire.ErrorBody(anthropicwire.ErrorType(ae.Status), ae.Message))
		return
	}
	ctx.SetBody(openaiwire.ErrorBody(ae.Message, ae.Type, ae.Code, ae.Param))
}

// errMalformed is the answer to a request that is not valid HTTP: fixed, it quotes nothing.
func errMalformed() *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "malformed_request",
		Message: "the HTTP request is malformed"}
}

// checkHeaders refuses what fasthttp parses but HTTP forbids: a field name that is not a token
// (RFC 9110 §5.1), or a value holding CR, LF or NUL ("invalid and dangerous", §5.5; a bare CR
// stays inside a value in fasthttp), which could otherwise reach a backend in a forwarded
// header. A bare LF ending a line is tolerated, as RFC 9112 §2.2 allows.
func checkHeaders(c *fiber.Ctx) error {
	bad := false
	c.Request().Header.VisitAll(func(k, v []byte) {
		bad = bad || !isToken(k) || bytes.ContainsAny(v, "\r\n\x00")
	})
	if bad {
		return errMalformed()
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
