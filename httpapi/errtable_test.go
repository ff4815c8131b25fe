package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

type errorCase struct {
	name string
	err  error
}

// errorCases: every answer the gateway gives for an error (baseline: as the code wrote them
// before the table).
func errorCases() []errorCase {
	lit := func(name string, ae *apiError) errorCase { return errorCase{name, ae} }
	return []errorCase{
		{intent.ErrKeyReused.Error(), intent.ErrKeyReused},
		{intent.ErrKeyForeign.Error(), intent.ErrKeyForeign},
		{ledger.ErrBudgetExceeded.Error(), ledger.ErrBudgetExceeded},
		{intent.ErrContended.Error(), intent.ErrContended},
		{intent.ErrHistoryLost.Error(), intent.ErrHistoryLost},
		{intent.ErrInterrupted.Error(), intent.ErrInterrupted},
		{intent.ErrJobChanging.Error(), intent.ErrJobChanging},
		{intent.ErrNoJob.Error(), intent.ErrNoJob},
		{intent.ErrNoRecord.Error(), intent.ErrNoRecord},
		lit("httpapi: Content-Type is not application/json", &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_media_type",
			Message: "Content-Type must be application/json"}),
		lit("httpapi: no API key", &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "missing_api_key",
			Message: "an API key is required (Authorization: Bearer <key> or x-api-key)"}),
		lit("httpapi: invalid API key", &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "invalid API key"}),
		lit("httpapi: no valid admin API key", &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Message: "an admin API key is required"}),
		lit("httpapi: the admin API is not configured", errNotFound("unknown URL")),
		lit("httpapi: the Idempotency-Key is in use", &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_key_in_use",
			Message: "a request with this Idempotency-Key is still in progress; retry shortly", ShouldRetry: &retryYes, RetryAfter: 1}),
		lit("httpapi: Oncegate-Timeout passed", clientDeadlinePassed().(*apiError)),
		lit("httpapi: the record is not readable", unavailable("the result is not readable yet; retry")),
		lit("httpapi: the record has no result", unavailable("the result is not available yet; retry")),
		lit("httpapi: the status board is not readable", unavailable("status is not readable right now")),
		{"httpapi: internal error", errors.New("some failure")},
		{"httpapi: unknown URL", fiber.ErrNotFound},
		{"httpapi: method not allowed", fiber.ErrMethodNotAllowed},
		{"httpapi: request body too large", fiber.ErrRequestEntityTooLarge},
		lit("httpapi: request header too large", &apiError{Status: http.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: "request_header_too_large", Message: "the request header is too large"}),
		lit("httpapi: request not received in time", &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout", Message: "the request was not received in time"}),
		lit("httpapi: malformed HTTP request", errMalformed()),
		lit("httpapi: no model", badRequest("missing_required_parameter", "model", "you must provide a model parameter")),
		lit("httpapi: no messages", badRequest("missing_required_parameter", "messages", "messages must be a non-empty array")),
		lit("httpapi: no max_tokens", badRequest("missing_required_parameter", "max_tokens", "max_tokens: a positive integer is required")),
		lit("httpapi: stream is not a boolean", badRequest("invalid_type", "stream", "stream must be a boolean")),
		lit("httpapi: invalid Oncegate-Timeout", badRequest("invalid_header", "Oncegate-Timeout", "Oncegate-Timeout must be a number of seconds between 0 and 86400")),
		lit("httpapi: invalid Last-Event-ID", badRequest("invalid_last_event_id", "", "Last-Event-ID must be an event id from this stream")),
		lit("httpapi: invalid starting_after", badRequest("invalid_value", "starting_after", "starting_after must be an integer")),
		lit("httpapi: invalid from", badRequest("invalid_value", "from", "from must be an RFC 3339 time")),
		lit("httpapi: invalid to", badRequest("invalid_value", "to", "to must be an RFC 3339 time")),
		lit("httpapi: to is not after from", badRequest("invalid_value", "to", "to must be after from")),
		lit("httpapi: invalid period", badRequest("invalid_value", "period", "period must be YYYY-MM or YYYY-MM-DD")),
		lit("httpapi: key is not URL path text", badRequest("invalid_idempotency_key", "", "the key is not valid URL path text")),
		lit("httpapi: the execution failed", &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "execution_failed", Message: "the execution failed"}),
		lit("httpapi: the job was cancelled", &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "job_cancelled", Message: "the job was cancelled"}),
		lit("httpapi: the execution restarted", &apiError{Status: 500, Type: "server_error", Code: "execution_restarted",
			Message: "the execution was restarted after a worker was lost; retry with the same Idempotency-Key to receive the complete answer"}),
		lit("httpapi: the stream was interrupted", &apiError{Status: 500, Type: "server_error", Code: "stream_interrupted",
			Message: "the stream was interrupted; retry with the same Idempotency-Key to receive the complete answer"}),
		// Parameterized answers.
		lit("invalidJSON", badRequest("invalid_json", "", "request body is not a valid JSON object: "+"jsonscan: invalid character at offset 3")),
		lit("modelNotFound", &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist or is not served by this gateway on this API", "gpt-x")}),
		lit("tokenNotInteger", badRequest("invalid_type", "max_tokens", fmt.Sprintf("Invalid '%s': expected an integer.", "max_tokens"))),
		lit("tokenBelowMin", badRequest("integer_below_min_value", "max_tokens", fmt.Sprintf("Invalid '%s': expected a value >= 1.", "max_tokens"))),
		lit("tokenAboveMax", badRequest("integer_above_max_value", "max_completion_tokens", fmt.Sprintf("Invalid '%s': expected a value <= %d.", "max_completion_tokens", maxTokenLimit))),
		lit("keyHeaderInvalid", &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_idempotency_key",
			Message: errKeyTooLong.Error(), ShouldRetry: &retryNo}),
		lit("keyPathInvalid", badRequest("invalid_idempotency_key", "", errKeyCharset.Error())),
		lit("unavailable", unavailable("JetStream is not available")),
		{"fiberError 408", fiber.ErrRequestTimeout},
		{"fiberError 418", fiber.ErrTeapot},
		{"fiberError 502", fiber.ErrBadGateway},
	}
}

// TestErrorTable: every error answer, on a route of each provider format, as the client gets
// it: status, the retry headers the SDKs obey, content type and body. The golden file is the
// contract the e2e tests and the SDKs rely on; a change to any answer shows in it.
func TestErrorTable(t *testing.T) {
	cases := errorCases()
	sort.Slice(cases, func(i, j int) bool { return cases[i].name < cases[j].name })
	s := &Server{log: zerolog.Nop()}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: s.errorHandler})
	var current error
	fail := func(*fiber.Ctx) error { return current }
	app.Get("/v1/chat/completions", fail)
	app.Get("/v1/messages", fail)
	var out strings.Builder
	for _, tc := range cases {
		fmt.Fprintf(&out, "== %s\n", tc.name)
		for _, route := range []string{"/v1/chat/completions", "/v1/messages"} {
			current = tc.err
			resp, err := app.Test(httptest.NewRequest(http.MethodGet, route, nil))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			h := resp.Header
			fmt.Fprintf(&out, "%s %d x-should-retry=%q Retry-After=%q retry-after-ms=%q Content-Type=%q\n%s\n",
				route, resp.StatusCode, h.Get("x-should-retry"), h.Get("Retry-After"), h.Get("retry-after-ms"), h.Get("Content-Type"), body)
		}
	}
	testkit.Golden(t, "testdata/errors.golden", []byte(out.String()))
}
