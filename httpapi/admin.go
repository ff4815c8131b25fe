package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/ledger"
)

// LedgerReader is what the admin API reads from the billing ledger.
type LedgerReader interface {
	Entries(ctx context.Context, tenant string, from, to time.Time) ([]ledger.Entry, error)
	Bill(ctx context.Context, tenant string, from, to time.Time) (*ledger.Bill, error)
}

func (s *Server) routesAdmin(r fiber.Router) {
	r.Get("/admin/ledger", s.adminLedger)
	r.Get("/admin/bill", s.adminBill)
	s.routesKeys(r)
}

// authenticateAdmin checks the admin key (Authorization: Bearer or x-api-key). With no admin
// key configured the admin API does not exist (404).
func (s *Server) authenticateAdmin(c *fiber.Ctx) error {
	return s.admitAdmin(c, s.ledger != nil)
}

// admitAdmin checks the admin key for an admin API that exists when enabled (errAdminDisabled
// otherwise, or without an admin key configured).
func (s *Server) admitAdmin(c *fiber.Ctx, enabled bool) error {
	if len(s.adminKeys) == 0 || !enabled {
		return errAdminDisabled
	}
	if !s.isAdminKey(requestKey(c)) {
		return errAdminKeyRequired
	}
	return nil
}

// isAdminKey reports whether key is one of admin.api_keys_sha256's.
func (s *Server) isAdminKey(key string) bool {
	sum := sha256.Sum256([]byte(key))
	ok := 0
	for _, h := range s.adminKeys {
		ok |= subtle.ConstantTimeCompare(sum[:], h)
	}
	return key != "" && ok == 1
}

// adminLedger is GET /v1/admin/ledger?tenant=&from=&to=: the entries, as JSON lines.
func (s *Server) adminLedger(c *fiber.Ctx) error {
	if err := s.authenticateAdmin(c); err != nil {
		return err
	}
	from, to, err := timeRange(c.Query("from"), c.Query("to"))
	if err != nil {
		return err
	}
	entries, err := s.ledger.Entries(c.UserContext(), c.Query("tenant"), from, to)
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"object": "list", "data": entries})
}

// adminBill is GET /v1/admin/bill?tenant=&period=YYYY-MM|YYYY-MM-DD: gross, reversals, net,
// and the successful calls, executions avoided, cost per call and duplicate ratio
// (ledger.Calls).
func (s *Server) adminBill(c *fiber.Ctx) error {
	if err := s.authenticateAdmin(c); err != nil {
		return err
	}
	from, to, err := period(c.Query("period"))
	if err != nil {
		return err
	}
	bill, err := s.ledger.Bill(c.UserContext(), c.Query("tenant"), from, to)
	if err != nil {
		return err
	}
	return c.JSON(bill)
}

func timeRange(fromS, toS string) (from, to time.Time, err error) {
	to = time.Now().Add(time.Minute)
	if fromS != "" {
		if from, err = time.Parse(time.RFC3339, fromS); err != nil {
			return from, to, errBadFrom
		}
	}
	if toS != "" {
		if to, err = time.Parse(time.RFC3339, toS); err != nil {
			return from, to, errBadTo
		}
	}
	if !to.After(from) {
		return from, to, errToBeforeFrom
	}
	return from, to, nil
}

// period parses a month (2026-11) or a day (2026-11-29), UTC; empty is the current month.
func period(p string) (from, to time.Time, err error) {
	if p == "" {
		now := time.Now().UTC()
		from = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		return from, from.AddDate(0, 1, 0), nil
	}
	if from, err = time.Parse("2006-01-02", p); err == nil {
		return from, from.AddDate(0, 0, 1), nil
	}
	if from, err = time.Parse("2006-01", p); err == nil {
		return from, from.AddDate(0, 1, 0), nil
	}
	return from, to, errBadPeriod
}

func decodeKeyHashes(hexes []string) [][]byte {
	var out [][]byte
	for _, h := range hexes {
		if b, err := hex.DecodeString(h); err == nil {
			out = append(out, b)
		}
	}
	return out
}
