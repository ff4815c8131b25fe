package httpapi

import (
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/gofiber/fiber/v2"
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
