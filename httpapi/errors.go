package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/internal/anthropicwire"
	"github.com/oncegate/oncegate/internal/openaiwire"
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

// errorHandler is the one mapping from errors to responses: apiError as is, Fiber's own errors
// (404, 405, 413…) in OpenAI format, anything else as a 500 that does not leak err.Error().
func (s *Server) errorHandler(c *fiber.Ctx, err error) error {
	var ae *apiError
	if !errors.As(err, &ae) {
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
		if fe.Code >= 500 {
			ae.Type, ae.Code, ae.Message = "server_error", "internal_error", "internal error"
		}
	}
	return ae
}
