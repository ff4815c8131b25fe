package httpapi

import (
	"cmp"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// Other endpoints by policy: every path a backend lists in its passthrough (config
// backends[].passthrough) is served as POST with a JSON body. The body is forwarded as it is to
// the backend, at the path without its /v1 below the backend's base URL; the answer's status,
// body and Content-Type are stored and replayed as they are. It is a non-stream execution on
// the same admission as chat, whose record's API is "passthrough"; the path's policy decides
// what is deduplicated:
//
//	keyed-only (the default)  a request with an Idempotency-Key is deduplicated; a keyless one
//	                          executes every time (bypassed)
//	off                       every request executes (bypassed; /v1/images/generations's
//	                          default, "generate a new image" is never a duplicate)
//	on                        like chat: an explicit key, or the auto key of the content
//
// X-Allow-Duplicate and a model route's dedup: false bypass as everywhere. Which backend: the
// body's "model", when it names a routed model whose route has backends that list the path
// (they are the fallback chain, and the first one's policy applies); otherwise the first
// backend, in configuration order, that lists the path. A request without a routed model is
// billed under its path as the model name (ledger.prices can price it), from the usage the
// answer reports or else an estimate of its input. A path no backend lists is not routed: 404.

// Wire format of a passthrough request (kv.Record.API; the workers' backend.APIPassthrough).
const apiPassthrough = "passthrough"

// routesPassthrough registers every listed path.
func (s *Server) routesPassthrough() {
	for _, p := range s.router.PassthroughPaths() {
		s.app.Post(p, s.passthrough)
	}
}

// passthrough is POST to a listed path.
func (s *Server) passthrough(c *fiber.Ctx) error {
	ctx, obs := s.startObservation(c, telemetry.RoutePassthrough, telemetry.APIOpenAI)
	g, err := s.parsePassthrough(c)
	if err != nil {
		s.countError(&obs, nil, err)
		return err
	}
	g.observe(ctx, obs)
	return s.admitAndAnswer(ctx, c, g, s.deliver)
}

// parsePassthrough authenticates, validates and copies a passthrough request, and applies
// its path's policy. It changes no state.
func (s *Server) parsePassthrough(c *fiber.Ctx) (*generation, error) {
	// The body is opaque here: every field is the intent's ("stream" too, which a
	// passthrough body sends to the backend as it is).
	g, fields, err := s.readJSONRequestWith(c, func(string) bool { return false }, nil)
	if err != nil {
		return nil, err
	}
	path := c.Route().Path // as configured (Fiber matches paths case-insensitively)
	model, _ := fields.str("model")
	t, ok := s.router.ResolvePassthrough(path, model)
	if !ok {
		return nil, errUnknownURL
	}
	// The model it is charged under: a routed model, else the path (never any client text).
	g.Model = cmp.Or(t.Route.Model, path)
	g.Backends, g.API, g.Path = t.Backends, apiPassthrough, t.Path.BackendPath()
	if v := c.Get(fiber.HeaderAccept); v != "" {
		g.Header = map[string][]string{fiber.HeaderAccept: {strings.Clone(v)}}
	}
	rt := t.Route
	switch t.Path.Policy() {
	case config.DedupOff:
		rt.Dedup = false
	case config.DedupKeyedOnly:
		if _, present, _ := idempotencyKeyHeader(c); !present {
			rt.Dedup = false // a malformed key is refused by readIntent all the same
		}
	}
	if err := s.readIntent(c, g, rt); err != nil {
		return nil, err
	}
	g.nonStream()
	return g, nil
}
