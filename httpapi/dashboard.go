package httpapi

import (
	"context"
	_ "embed"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/dashboard"
)

// DashboardDeps is what the built-in dashboard needs: the hub that feeds its streams (nil: no
// dashboard, its URLs are 404) and the tally of outcomes per tenant this API counts into.
type DashboardDeps struct {
	Hub   *dashboard.Hub
	Tally *dashboard.Tally
	// Public opens the dashboard to any client when no tenants are configured (otherwise
	// loopback clients only). With tenants it changes nothing: a key is always needed.
	Public bool
}

//go:embed dashboard/index.html
var dashboardPage []byte

// maxDashboardStream bounds one dashboard stream; the page reconnects when it ends.
const maxDashboardStream = time.Hour

func (s *Server) routesDashboard() {
	s.app.Get("/", func(c *fiber.Ctx) error { return c.Redirect("/dashboard", fiber.StatusFound) })
	s.app.Get("/dashboard", s.dashboardPage)
	s.app.Get("/dashboard/stream", s.dashboardStream)
	s.app.Get("/dashboard/jobs/:id/events", s.dashboardTranscript)
}

// dashboardAccess decides what a dashboard caller sees, by the rules:
//   - with tenants configured, an API key is required (missing: 401 missing_api_key): an
//     admin key (admin.api_keys_sha256) sees every tenant, a tenant's key that tenant's rows
//     only, any other key is refused (401 invalid_api_key);
//   - without tenants, every caller is the anonymous tenant and sees everything, but only
//     from a loopback address unless the dashboard is public (403 dashboard_loopback_only).
func dashboardAccess(tenants, public, loopback bool, key string, isAdmin func(string) bool,
	tenantOf func(string) (string, bool)) (dashboard.Scope, error) {
	if !tenants {
		if public || loopback {
			return dashboard.Scope{All: true}, nil
		}
		return dashboard.Scope{}, errDashboardLoopback
	}
	if key == "" {
		return dashboard.Scope{}, errMissingAPIKey
	}
	if isAdmin(key) {
		return dashboard.Scope{All: true}, nil
	}
	if t, ok := tenantOf(key); ok {
		return dashboard.Scope{Tenant: t}, nil
	}
	return dashboard.Scope{}, errInvalidAPIKey
}

// dashboardScope is the caller's scope (dashboardAccess).
func (s *Server) dashboardScope(c *fiber.Ctx) (dashboard.Scope, error) {
	if s.dash.Hub == nil {
		return dashboard.Scope{}, errDashboardOff
	}
	sc, err := dashboardAccess(len(s.tenants) > 0, s.dash.Public, c.Context().RemoteIP().IsLoopback(), requestKey(c), s.isAdminKey, s.tenantOf)
	sc.Tenant = strings.Clone(sc.Tenant)
	return sc, err
}

// dashboardPage is GET /dashboard: the page (it holds no data; its stream asks for the key).
// Without tenants the loopback rule applies to the page too.
func (s *Server) dashboardPage(c *fiber.Ctx) error {
	if s.dash.Hub == nil {
		return errDashboardOff
	}
	if len(s.tenants) == 0 {
		if _, err := s.dashboardScope(c); err != nil {
			return err
		}
	}
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:")
	c.Set("X-Frame-Options", "DENY")
	return c.Send(dashboardPage)
}

// dashboardStream is GET /dashboard/stream: SSE of the caller's history first ("event:
// history", a dashboard.History: the charts' last 15 minutes and the rates now), then its
// View ("event: view"), at most every dashboard.UpdateEvery, with a ": ping" heartbeat while
// nothing else is sent. The key comes in a header (the page reads the stream with fetch),
// never in the URL.
func (s *Server) dashboardStream(c *fiber.Ctx) error {
	scope, err := s.dashboardScope(c)
	if err != nil {
		return err
	}
	sub, ok := s.dash.Hub.Subscribe(scope)
	if !ok {
		return errDashboardOff
	}
	// Subscribed first: a point sampled meanwhile comes again in the first view's points.
	hist, err := s.dash.Hub.History(scope)
	if err != nil {
		sub.Close()
		return err
	}
	first := sseFrame("history", hist)
	out := &sseWriter{}
	out.live(c, nil, s.writeTimeout, func() {
		defer sub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), maxDashboardStream)
		defer cancel()
		ping := time.NewTicker(heartbeatEvery)
		defer ping.Stop()
		if out.send(true, first) != nil { // the headers go now
			return
		}
		for {
			var frame []byte
			select {
			case <-ctx.Done():
				return
			case <-ping.C:
				frame = pingFrame
			case v, ok := <-sub.C():
				if !ok {
					return // the hub closed: the server is stopping
				}
				frame = sseFrame("view", v)
				ping.Reset(heartbeatEvery)
			}
			if out.send(true, frame) != nil {
				return // the client is gone
			}
		}
	})
	return nil
}

// sseFrame is one SSE event of name carrying data (one line of JSON).
func sseFrame(name string, data []byte) []byte {
	frame := make([]byte, 0, len(name)+len(data)+16)
	frame = append(append(append(append(append(frame, "event: "...), name...), "\ndata: "...), data...), "\n\n"...)
	return frame
}

// dashboardTranscript is GET /dashboard/jobs/{id}/events?tenant=T: the job events API for a
// dashboard caller. A tenant's key reads its own jobs only (tenant is ignored); an admin
// names the row's tenant, since job ids are namespaced by tenant.
func (s *Server) dashboardTranscript(c *fiber.Ctx) error {
	scope, err := s.dashboardScope(c)
	if err != nil {
		return err
	}
	tenant := scope.Tenant
	switch {
	case len(s.tenants) == 0:
		tenant = anonymousTenant
	case scope.All:
		tenant = strings.Clone(c.Query("tenant"))
	}
	return s.tenantJobEvents(c, tenant)
}
