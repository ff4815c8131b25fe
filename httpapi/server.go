// Package httpapi is oncegate's HTTP face: a Fiber v2 app with the OpenAI-compatible chat
// completions and Anthropic messages endpoints, the jobs and idempotency status APIs, models,
// admin and health. Handlers are thin: they copy what they need out of the borrowed *fiber.Ctx
// into an owned request, authenticate the tenant, validate, ask intent (the exactly-once core)
// what the request is attached to, and write the answer. The record store and the job queue
// are intent's; httpapi never writes a record. Every error goes through one handler that
// writes it in the route's provider format.
//
// A Server is safe for concurrent use; the goroutines it starts end with the request that
// started them. WatchReadiness, which keeps /readyz's verdict, runs in its caller's goroutine
// until its ctx ends.
package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/tracing"
)

// Router resolves a model name to the backends that serve it.
type Router interface {
	Resolve(model string) (config.RouteTarget, bool)
	ModelNames() []string
	Backend(name string) (config.Backend, bool)
	// PassthroughPaths and ResolvePassthrough: the paths backends serve as they are (passthrough.go).
	PassthroughPaths() []string
	ResolvePassthrough(path, model string) (config.PassthroughTarget, bool)
}

// StatusReader returns each live worker's posted status.
type StatusReader interface {
	Read(ctx context.Context) (map[string]json.RawMessage, error)
}

// WorkerCounter counts the workers that posted to the status board lately (status.Posts).
type WorkerCounter interface {
	Workers() int
}

// Deps is what the API needs.
type Deps struct {
	// NC and JS are for readiness only (WatchReadiness; /readyz reads NC's state).
	NC *nats.Conn
	JS jetstream.JetStream
	// Intents decides every generation request (admission) and answers the status APIs.
	Intents *intent.Core
	Router  Router
	// Status reads the workers' backend health (circuit breakers, retry budgets).
	Status StatusReader
	// Workers counts the workers seen posting to the status board lately, without reading it
	// (WatchReadiness reads the board only while it counts none); optional.
	Workers WorkerCounter
	// Resources says whether the streams and buckets exist and can take an admission's writes
	// (WatchReadiness); optional.
	Resources ResourceChecker
	Tenants   []config.Tenant
	// Effects is the effects ledger (the effects API, /v1/idempotency/{key}/effects); nil: no
	// effects API.
	Effects EffectLedger
	// Ledger and AdminKeys enable the admin API (entries, bills); optional.
	Ledger          LedgerReader
	AdminKeysSHA256 []string
	// Keys are the API keys managed at run time (apikeys.go); nil: the configured ones only.
	Keys KeyStore
	// Models lists the models of catch-all backends for /v1/models; nil: none.
	Models ModelCatalog
	Idem   config.Idempotency
	HTTP   config.HTTP
	Log    zerolog.Logger
	// Tracer starts each generation request's span and carries its trace to the execution
	// (nil: off; a client's traceparent still reaches the backend).
	Tracer *tracing.Tracer
	// Metrics counts every request's outcome and serves /metrics; nil: neither.
	Metrics *telemetry.Metrics
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Dashboard serves /dashboard (dashboard.go); zero: no dashboard.
	Dashboard DashboardDeps
	// Dialects admits a request only to the backends a dialect serves its API on (the
	// workers' table, dialects.Registry); nil: no backend is left out for its type's dialects.
	Dialects *dialect.Registry
}

// Server holds the Fiber app.
type Server struct {
	app       *fiber.App
	nc        *nats.Conn
	js        jetstream.JetStream
	intents   *intent.Core
	router    Router
	status    StatusReader
	workers   WorkerCounter
	resources ResourceChecker
	tenants   []tenantKeys
	ledger    LedgerReader
	effects   EffectLedger // nil: no effects API
	adminKeys [][]byte
	keys      KeyStore     // nil: no run-time keys
	catalog   ModelCatalog // nil: no catch-all backend's list
	dialects  *dialect.Registry
	idem      config.Idempotency
	log       zerolog.Logger
	tracer    *tracing.Tracer
	// accessSample is the share of requests the access log writes (config http.access_log_sample).
	accessSample float64
	now          func() time.Time
	// writeTimeout bounds one write to a client (for SSE: each flush, not the whole stream).
	writeTimeout time.Duration
	ready        readiness // /readyz's verdict, kept by WatchReadiness
	metrics      *telemetry.Metrics
	// metricsHandler serves the registry (fasthttp-adapted once).
	metricsHandler fiber.Handler
	// bodyLimit is the app's BodyLimit (Fiber's default when the config has none).
	bodyLimit int
	// dash feeds /dashboard's streams; dashTally counts outcomes per tenant for it.
	dash      DashboardDeps
	dashTally *dashboard.Tally
}

type tenantKeys struct {
	id     string
	hashes [][]byte
}

// anonymousTenant is the tenant of every request when no tenants are configured.
const anonymousTenant = "anonymous"

// New builds the app and its routes.
func New(d Deps) *Server {
	s := &Server{nc: d.NC, js: d.JS, intents: d.Intents, router: d.Router, status: d.Status, workers: d.Workers, resources: d.Resources, idem: d.Idem, log: d.Log,
		now: d.Now, writeTimeout: d.HTTP.WriteTimeout.D(), ledger: d.Ledger, keys: d.Keys, catalog: d.Models, metrics: d.Metrics, tracer: d.Tracer,
		accessSample: d.HTTP.AccessLogSample, dash: d.Dashboard, dashTally: d.Dashboard.Tally, dialects: d.Dialects, effects: d.Effects}
	if s.now == nil {
		s.now = time.Now
	}
	s.adminKeys = decodeKeyHashes(d.AdminKeysSHA256)
	for _, t := range d.Tenants {
		tk := tenantKeys{id: t.ID}
		for _, h := range t.APIKeysSHA256 {
			b, err := hex.DecodeString(h)
			if err == nil {
				tk.hashes = append(tk.hashes, b)
			}
		}
		s.tenants = append(s.tenants, tk)
	}
	s.app = fiber.New(fiber.Config{
		AppName:               "oncegate",
		BodyLimit:             d.HTTP.MaxBodyBytes,
		ReadTimeout:           d.HTTP.ReadTimeout.D(),
		WriteTimeout:          d.HTTP.WriteTimeout.D(), // SSE writers extend it per flush (sseOut)
		IdleTimeout:           d.HTTP.IdleTimeout.D(),
		DisableStartupMessage: true,
		ErrorHandler:          s.errorHandler,
		StreamRequestBody:     true, // readBody reads each body into a buffer of its size
	})
	// Requests fasthttp cannot read never reach Fiber's ErrorHandler as themselves: answer them
	// with a fixed body (malformedRequest), and keep fasthttp's error texts free of the request
	// bytes in case anything logs them.
	s.bodyLimit = s.app.Config().BodyLimit
	srv := s.app.Server()
	srv.ErrorHandler = s.malformedRequest
	srv.SecureErrorLogMessage = true
	srv.HeaderReceived = s.headerReceived
	s.app.Use(s.readBody, checkHeaders)
	s.app.Get("/healthz", s.healthz)
	s.app.Get("/readyz", s.readyz)
	if s.metrics != nil {
		s.metricsHandler = adaptor.HTTPHandler(s.metrics.Handler())
		s.app.Get("/metrics", s.metricsPage)
	}
	v1 := s.app.Group("/v1")
	v1.Get("/models", s.models)
	v1.Get("/status", s.statusPage)
	v1.Post("/chat/completions", s.chatCompletions)
	v1.Post("/messages", s.messages)
	v1.Post("/embeddings", s.embeddings)
	s.routesPassthrough()
	s.routesResponses(v1)
	s.routesJobs(v1)
	s.routesEffects(v1)
	s.routesAdmin(v1)
	s.routesDashboard()
	return s
}

// App exposes the Fiber app (for Listen and for tests).
func (s *Server) App() *fiber.App { return s.app }

// Shutdown stops accepting and waits for in-flight responses, streams included, to finish
// (bounded by ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	if s.dash.Hub != nil {
		s.dash.Hub.Close() // open dashboards end now: the shutdown waits for every stream
	}
	return s.app.ShutdownWithContext(ctx)
}

func (s *Server) healthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

func (s *Server) models(c *fiber.Ctx) error {
	if _, err := s.authenticate(c); err != nil {
		return err
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	names := s.router.ModelNames()
	data := make([]model, 0, len(names))
	listed := make(map[string]bool, len(names))
	for _, n := range names {
		owner := "oncegate"
		if rt, ok := s.router.Resolve(n); ok && len(rt.Backends) > 0 {
			owner = rt.Backends[0]
		}
		data = append(data, model{ID: n, Object: "model", Created: 0, OwnedBy: owner})
		listed[n] = true
	}
	if s.catalog != nil {
		// A catch-all backend's own models, those a request would be routed to it with.
		for _, m := range s.catalog.CatchAllModels(c.UserContext()) {
			if rt, ok := s.router.Resolve(m.ID); !listed[m.ID] && ok && len(rt.Backends) > 0 && rt.Backends[0] == m.Backend {
				data = append(data, model{ID: m.ID, Object: "model", Created: 0, OwnedBy: m.Backend})
				listed[m.ID] = true
			}
		}
		slices.SortFunc(data, func(a, b model) int { return strings.Compare(a.ID, b.ID) })
	}
	return c.JSON(fiber.Map{"object": "list", "data": data})
}

// ModelCatalog lists the models of the backends that serve every model nobody else does
// (models: ["*"]), as each backend lists them itself, for /v1/models.
type ModelCatalog interface {
	CatchAllModels(ctx context.Context) []CatalogModel
}

// CatalogModel is one model a catch-all backend lists.
type CatalogModel struct {
	ID      string
	Backend string // the backend's name
}

// statusPage is GET /v1/status: every live worker's backends (breaker state, window counts,
// retry budget).
func (s *Server) statusPage(c *fiber.Ctx) error {
	if _, err := s.authenticate(c); err != nil {
		return err
	}
	if s.status == nil {
		return c.JSON(fiber.Map{"workers": fiber.Map{}})
	}
	ws, err := s.status.Read(c.UserContext())
	if err != nil {
		return errStatusUnreadable
	}
	return c.JSON(fiber.Map{"workers": ws})
}

// authenticate returns the caller's tenant. With no tenants configured every caller is the
// anonymous tenant (and any Authorization header is ignored).
func (s *Server) authenticate(c *fiber.Ctx) (string, error) {
	if len(s.tenants) == 0 {
		return anonymousTenant, nil
	}
	key := requestKey(c)
	if key == "" {
		return "", errMissingAPIKey
	}
	found, ok := s.tenantOf(key)
	if !ok {
		return "", errInvalidAPIKey
	}
	return found, nil
}

// requestKey is the request's API key: x-api-key, else Authorization: Bearer ("" if none).
// It is Fiber's memory: valid during the handler only.
func requestKey(c *fiber.Ctx) string {
	key := c.Get("x-api-key")
	if key == "" {
		auth := c.Get(fiber.HeaderAuthorization)
		if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
			key = strings.TrimSpace(auth[7:])
		}
	}
	return key
}

// tenantOf is the tenant whose API key key is.
func (s *Server) tenantOf(key string) (string, bool) {
	sum := sha256.Sum256([]byte(key))
	if tenant, ok, known := s.runtimeTenantOf(sum); known {
		return tenant, ok
	}
	found := ""
	for _, t := range s.tenants {
		for _, h := range t.hashes {
			// compare against every key, so the time does not say which tenant matched
			if subtle.ConstantTimeCompare(sum[:], h) == 1 {
				found = t.id
			}
		}
	}
	return found, found != ""
}
