package httpapi

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// POST /v1/embeddings (the OpenAI format) is one more front door to the same admission, as a
// non-stream execution: the record's API is "embeddings", which the worker sends to the
// backend's /embeddings with the body as the client wrote it (a string, an array of strings,
// token arrays: batches pass through as they are), and the backend's body is stored and
// replayed byte for byte. Deduplication is chat's: an explicit Idempotency-Key, or the auto key
// of the content on this path (the window, retry headers, 422 on reuse, X-Allow-Duplicate,
// a route's dedup: false). The usage's prompt_tokens are charged as input tokens; an
// embedding has no output tokens. Prefer: respond-async is not offered here (an embedding is
// one short answer), and a route's degraded message (a chat answer) is not either: with no
// healthy backend the request gets the 503.

// Wire format of an embeddings request (kv.Record.API; the workers' backend.APIEmbeddings):
// the backend's path is /embeddings.
const apiEmbeddings = "embeddings"

// Errors of the embeddings API.
var (
	errNoInput  = errors.New("httpapi: no input")
	errBadInput = errors.New("httpapi: invalid input")
)

// embeddings is POST /v1/embeddings.
func (s *Server) embeddings(c *fiber.Ctx) error {
	ctx, obs := s.startObservation(c, telemetry.RouteEmbeddings, telemetry.APIOpenAI)
	g, err := s.parseEmbeddings(c)
	if err != nil {
		s.countError(&obs, nil, err)
		return err
	}
	g.observe(ctx, obs)
	return s.admitAndAnswer(ctx, c, g, s.deliver)
}

// admitAndAnswer admits a request that is answered in the handler (not by a live stream) and
// answers it with respond (deliver, or respondAccepted for a job), counting the outcome.
func (s *Server) admitAndAnswer(ctx context.Context, c *fiber.Ctx, g *generation,
	respond func(*fiber.Ctx, *generation, *intent.Admission) error) error {
	adm, err := s.admit(ctx, g)
	if err != nil {
		s.countError(&g.obs, nil, err)
		return err
	}
	if err := respond(c, g, adm); err != nil {
		s.countError(&g.obs, adm, err)
		return err
	}
	s.countAnswer(c, &g.obs, adm)
	return nil
}

// parseEmbeddings authenticates, validates and copies an embeddings request. It changes no
// state.
func (s *Server) parseEmbeddings(c *fiber.Ctx) (*generation, error) {
	g, fields, err := s.readJSONRequest(c)
	if err != nil {
		return nil, err
	}
	model, err := fields.model()
	if err != nil {
		return nil, err
	}
	if err = checkEmbeddingInput(fields["input"]); err != nil {
		return nil, err
	}
	rt, ok := s.router.Resolve(model)
	backends := s.compatible(rt.Backends, apiOpenAI)
	if !ok || len(backends) == 0 {
		return nil, modelNotFound(model)
	}
	g.Model, g.Backends, g.API = model, backends, apiEmbeddings
	if err := s.readIntent(c, g, rt); err != nil {
		return nil, err
	}
	g.nonStream()
	return g, nil
}

// nonStream keeps a request that has one answer and no generated output (embeddings,
// passthrough) off what only generations have: background jobs (Prefer: respond-async), the
// route's degraded chat message (the route's 503 and its Retry-After stay), and the budget's
// estimate of a generation's output (MaxTokens 1 instead of the default max_tokens).
func (g *generation) nonStream() {
	g.Async, g.Stream, g.MaxTokens = false, false, 1
	if g.Degraded != nil {
		g.Degraded.Message = ""
	}
}

// checkEmbeddingInput accepts the four shapes of OpenAI's "input": a non-empty string, or a
// non-empty array of non-empty strings, of token ids, or of non-empty token-id arrays.
func checkEmbeddingInput(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return errNoInput
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return errBadInput
		}
		return nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return errBadInput
	}
	var ids []uint64
	if json.Unmarshal(raw, &ids) == nil {
		return nil
	}
	for _, el := range list {
		var str string
		var toks []uint64
		switch {
		case json.Unmarshal(el, &str) == nil && str != "":
		case json.Unmarshal(el, &toks) == nil && len(toks) > 0:
		default:
			return errBadInput
		}
	}
	return nil
}
