package httpapi

import (
	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/kv"
)

func (s *Server) routesJobs(r fiber.Router) {}

// jobStatus maps a record to the jobs API status.
func jobStatus(rec *kv.Record) string {
	switch {
	case rec == nil:
		return "queued"
	case rec.Cancelled:
		return "cancelled"
	case rec.State == kv.Completed:
		return "completed"
	case rec.State == kv.Failed:
		return "failed"
	case rec.Progress == kv.ProgressQueued:
		return "queued"
	}
	return "running"
}
