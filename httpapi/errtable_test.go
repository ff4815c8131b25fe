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

	"github.com/oncegate/oncegate/internal/testkit"
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
		{"fiberError 408", fiber.ErrRequestTimeout},
		{"fiberError 418", fiber.ErrTeapot},
		{"fiberError 502", fiber.ErrBadGateway},
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
