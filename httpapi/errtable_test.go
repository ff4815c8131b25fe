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
	"time"

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

// errorCases: every row of errorTable, named by its error, and the answers that carry a part
// of the request, with sample values.
func errorCases() []errorCase {
	var cases []errorCase
	for _, row := range errorTable {
		cases = append(cases, errorCase{row.err.Error(), row.err})
	}
	return append(cases, []errorCase{
		{"invalidJSON", invalidJSON(errors.New("jsonscan: invalid character at offset 3"))},
		{"modelNotFound", modelNotFound("gpt-x")},
		{"tokenNotInteger", tokenNotInteger("max_tokens")},
		{"tokenBelowMin", tokenBelowMin("max_tokens")},
		{"tokenAboveMax", tokenAboveMax("max_completion_tokens")},
		{"keyHeaderInvalid", keyHeaderInvalid(errKeyTooLong)},
		{"keyPathInvalid", keyPathInvalid(errKeyCharset)},
		{"unavailable", unavailable("JetStream is not available")},
		{"LimitError streams", fmt.Errorf("intent: %w", &intent.LimitError{Limit: "streams", Cap: 4, RetryAfter: time.Second})},
		{"LimitError requests_per_second", &intent.LimitError{Limit: "requests_per_second", Cap: 2.5, RetryAfter: 1300 * time.Millisecond}},
		{"LimitError tokens_per_minute", &intent.LimitError{Limit: "tokens_per_minute", Cap: 1000, RetryAfter: 12 * time.Second}},
		{"LimitError tokens_per_minute too large", &intent.LimitError{Limit: "tokens_per_minute", Cap: 1000, TooLarge: true}},
		{"BudgetError reached", &ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 5000, EstimateMicros: 54}},
		{"BudgetError no fit, recent answers", &ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 4970, EstimateMicros: 54,
			OutputFrom: ledger.OutputFromRecent, OutputTokens: 16, FitMaxTokens: 4}},
		{"BudgetError no fit, default", &ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 2940, EstimateMicros: 2070,
			OutputFrom: ledger.OutputFromDefault, OutputTokens: 1024, FitMaxTokens: 1019}},
		{"BudgetError no fit, in flight", &ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 4900, ReservedMicros: 80, EstimateMicros: 54,
			OutputFrom: ledger.OutputFromMaxTokens, OutputTokens: 16}},
		{"fiberError 404", fiber.ErrNotFound},
		{"fiberError 405", fiber.ErrMethodNotAllowed},
		{"fiberError 408", fiber.ErrRequestTimeout},
		{"fiberError 413", fiber.ErrRequestEntityTooLarge},
		{"fiberError 418", fiber.ErrTeapot},
		{"fiberError 502", fiber.ErrBadGateway},
		// An error without a row is a 500 that does not quote it.
		{"no row", fmt.Errorf("kv: claim: %w", errors.New("secret detail"))},
	}...)
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

// TestForwardErrorRetryHeaders: an error body the execution produced keeps its status and
// body, and gets the gateway's retry advice through the same headers as the table's answers.
func TestForwardErrorRetryHeaders(t *testing.T) {
	body := []byte(`{"error":{"message":"upstream said no"}}`)
	cases := []struct {
		name       string
		status     int
		retry      retryAdvice
		after      int
		wantRetry  string
		wantAfter  string
		wantMillis string
	}{
		{name: "backend answer", status: http.StatusBadRequest, retry: retryNo, wantRetry: "false"},
		{name: "failed after dispatch", status: http.StatusBadGateway, retry: retryIf(false), wantRetry: "false"},
		{name: "nothing ran, come back later", status: http.StatusServiceUnavailable, retry: retryIf(true), after: 3,
			wantRetry: "true", wantAfter: "3", wantMillis: "3000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			app := fiber.New(fiber.Config{DisableStartupMessage: true})
			app.Get("/", func(c *fiber.Ctx) error { return forwardError(c, tc.status, body, tc.retry, tc.after) })
			resp, err := app.Test(httptest.NewRequest(http.MethodGet, "/", nil))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			h := resp.Header
			if resp.StatusCode != tc.status || string(got) != string(body) || h.Get("Content-Type") != fiber.MIMEApplicationJSON {
				t.Errorf("status %d, content type %q, body %s; want %d, JSON, %s", resp.StatusCode, h.Get("Content-Type"), got, tc.status, body)
			}
			if h.Get("x-should-retry") != tc.wantRetry || h.Get("Retry-After") != tc.wantAfter || h.Get("retry-after-ms") != tc.wantMillis {
				t.Errorf("x-should-retry %q, Retry-After %q, retry-after-ms %q; want %q, %q, %q", h.Get("x-should-retry"),
					h.Get("Retry-After"), h.Get("retry-after-ms"), tc.wantRetry, tc.wantAfter, tc.wantMillis)
			}
		})
	}
}
