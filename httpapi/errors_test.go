package httpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/ledger"
)

// TestRetryAfterHeaders: an error that says when to come back says it the same way in both
// headers the SDKs read (retry-after-ms is read first by the OpenAI SDKs).
func TestRetryAfterHeaders(t *testing.T) {
	for _, secs := range []int{1, 2, 30} {
		t.Run(strconv.Itoa(secs), func(t *testing.T) {
			app := fiber.New(fiber.Config{DisableStartupMessage: true})
			app.Get("/", func(c *fiber.Ctx) error {
				ae := unavailable("busy")
				ae.RetryAfter = secs
				return writeAPIError(c, ae)
			})
			resp, err := app.Test(httptest.NewRequest("GET", "/", nil))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			ra, ms := resp.Header.Get("Retry-After"), resp.Header.Get("retry-after-ms")
			if ra != strconv.Itoa(secs) || ms != strconv.Itoa(secs*1000) {
				t.Fatalf("Retry-After %q, retry-after-ms %q; want %d and %d", ra, ms, secs, secs*1000)
			}
		})
	}
}

// TestBudgetRefusals (issue 43 item 3): a refusal while the tenant's spend is below its limit
// is not "the limit is reached": it has a code of its own, says what remains and the
// max_tokens that fits, and a refusal at the limit keeps the budget_exceeded answer. Both are
// 429s the SDKs do not retry.
func TestBudgetRefusals(t *testing.T) {
	wrap := func(be *ledger.BudgetError) error { return fmt.Errorf("intent: budget of acme: %w", be) }
	for _, tc := range []struct {
		name     string
		err      error
		code     string
		contains []string
		lacks    []string
	}{
		{"reached", wrap(&ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 5000, EstimateMicros: 60}),
			"budget_exceeded", []string{"is reached"}, []string{"max_tokens"}},
		{"over", wrap(&ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 5012, EstimateMicros: 60}),
			"budget_exceeded", []string{"is reached"}, []string{"max_tokens"}},
		{"does not fit", wrap(&ledger.BudgetError{Tenant: "acme", LimitMicros: 5000, SpentMicros: 2940, EstimateMicros: 2070}),
			"budget_insufficient", []string{"does not fit", "2060 of 5000", "max_tokens"}, []string{"is reached"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ae := answer(tc.err)
			if ae.Status != http.StatusTooManyRequests || ae.Code != tc.code || ae.Retry != retryNo {
				t.Fatalf("answer %+v: want 429 %s, x-should-retry false", ae, tc.code)
			}
			for _, s := range tc.contains {
				if !strings.Contains(ae.Message, s) {
					t.Errorf("message %q lacks %q", ae.Message, s)
				}
			}
			for _, s := range tc.lacks {
				if strings.Contains(ae.Message, s) {
					t.Errorf("message %q says %q", ae.Message, s)
				}
			}
		})
	}
}
