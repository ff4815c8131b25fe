package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/effects"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// The effects API (issue 47): a caller's side effects driven by an intent's answer, each run
// once, under the intent's own resource. An effect is named by the caller (a tool call's id
// is the natural name: a replayed answer carries the same ids) and scoped like the status
// API: the intent must exist and be the caller's tenant's, else 404. docs/effects.md has the
// pattern; effects/ the rules.

// EffectLedger is what the effects API needs of the effects ledger (effects.Store).
type EffectLedger interface {
	Claim(ctx context.Context, id effects.ID, req effects.ClaimRequest) (*effects.Entry, error)
	Complete(ctx context.Context, id effects.ID, fence uint64, result []byte) (*effects.Entry, error)
	Unknown(ctx context.Context, id effects.ID, fence uint64) (*effects.Entry, error)
	Release(ctx context.Context, id effects.ID, fence uint64) (*effects.Entry, error)
	Renew(ctx context.Context, id effects.ID, fence uint64, lease time.Duration) (*effects.Entry, error)
	List(ctx context.Context, tenant, intentKey string) ([]*effects.Entry, error)
	TTL() time.Duration
}

// Bounds of the effects API's input.
const (
	maxEffectName      = 128
	maxFingerprint     = 256
	maxClaimID         = 64
	minEffectLease     = 100 * time.Millisecond
	maxEffectLease     = time.Hour
	defaultEffectLease = time.Minute
	// maxEffectResult bounds a recorded result (it is stored in one JetStream message).
	maxEffectResult = 512 << 10
)

// Errors of the effects API's input; each is a row of errorTable. Nothing is written when
// one is returned.
var (
	errEffectBody        = errors.New("httpapi: the effect body is not the JSON object the route takes")
	errEffectName        = errors.New("httpapi: invalid effect name")
	errEffectFingerprint = errors.New("httpapi: no valid fingerprint")
	errEffectLease       = errors.New("httpapi: lease_ms out of range")
	errEffectClaimID     = errors.New("httpapi: invalid claim_id")
	errEffectFence       = errors.New("httpapi: no valid fence")
	errEffectResult      = errors.New("httpapi: no result")
	errEffectResultSize  = errors.New("httpapi: result too large")
)

func (s *Server) routesEffects(r fiber.Router) {
	if s.effects == nil {
		return
	}
	r.Get("/idempotency/:key/effects", s.listEffects)
	r.Post("/idempotency/:key/effects/:name", s.claimEffect)
	r.Put("/idempotency/:key/effects/:name", s.completeEffect)
	r.Post("/idempotency/:key/effects/:name/unknown", s.unknownEffect)
	r.Post("/idempotency/:key/effects/:name/release", s.releaseEffect)
	r.Post("/idempotency/:key/effects/:name/renew", s.renewEffect)
}

// effectTarget is the caller's tenant and the record key of the intent a request names
// (404 when there is none for this tenant), read out of the borrowed context (owned strings).
func (s *Server) effectTarget(c *fiber.Ctx) (tenant, recKey string, err error) {
	tenant, err = s.authenticate(c)
	if err != nil {
		return "", "", err
	}
	key, err := pathKey(c)
	if err != nil {
		return "", "", err
	}
	recKey, _, err = s.intents.Lookup(c.UserContext(), tenant, key)
	if err != nil {
		return "", "", err
	}
	return tenant, recKey, nil
}

// effectID is the effect a request names: effectTarget and the path's name, checked
// (1-128 characters: letters, digits, _ - . :).
func (s *Server) effectID(c *fiber.Ctx) (effects.ID, error) {
	name, err := url.PathUnescape(c.Params("name"))
	if err != nil || !validEffectName(name) {
		return effects.ID{}, errEffectName
	}
	name = strings.Clone(name) // PathUnescape returns Fiber's memory when there is no escape
	tenant, recKey, err := s.effectTarget(c)
	if err != nil {
		return effects.ID{}, err
	}
	return effects.ID{Tenant: tenant, Intent: recKey, Name: name}, nil
}

func validEffectName(name string) bool {
	if name == "" || len(name) > maxEffectName {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// printable reports whether s is 1 to max printable ASCII characters without spaces.
func printable(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// decodeEffectBody reads the request body into v strictly: one JSON object, no unknown
// members (a misspelt lease_ms would otherwise be a default lease).
func decodeEffectBody(c *fiber.Ctx, v any) error {
	d := json.NewDecoder(bytes.NewReader(c.Body()))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return errEffectBody
	}
	if d.More() {
		return errEffectBody
	}
	return nil
}

// effectLease is a body's lease_ms (nil: the default): 100 ms to an hour, and no longer than
// the idempotency TTL (an entry must outlive its claim).
func (s *Server) effectLease(ms *int64) (time.Duration, error) {
	if ms == nil {
		return defaultEffectLease, nil
	}
	lease := time.Duration(*ms) * time.Millisecond
	if *ms < minEffectLease.Milliseconds() || *ms > maxEffectLease.Milliseconds() || lease > s.effects.TTL() {
		return 0, errEffectLease
	}
	return lease, nil
}

// claimEffect is POST /v1/idempotency/{key}/effects/{name} {"fingerprint", "lease_ms",
// "reconciled", "claim_id"}: 201 claimed (run the effect), 200 completed (the recorded
// result, byte for byte), 409 in_progress with Retry-After (1 s), 409 needs_reconcile (with the
// fence a reconciler completes it with), 422 when the arguments differ.
func (s *Server) claimEffect(c *fiber.Ctx) error {
	var body struct {
		Fingerprint string `json:"fingerprint"`
		LeaseMS     *int64 `json:"lease_ms"`
		Reconciled  bool   `json:"reconciled"`
		ClaimID     string `json:"claim_id"`
	}
	if err := decodeEffectBody(c, &body); err != nil {
		return err
	}
	if !printable(body.Fingerprint, maxFingerprint) {
		return errEffectFingerprint
	}
	if body.ClaimID != "" && !printable(body.ClaimID, maxClaimID) {
		return errEffectClaimID
	}
	lease, err := s.effectLease(body.LeaseMS)
	if err != nil {
		return err
	}
	id, err := s.effectID(c)
	if err != nil {
		return err
	}
	e, err := s.effects.Claim(c.UserContext(), id, effects.ClaimRequest{Fingerprint: body.Fingerprint, Lease: lease,
		Reconciled: body.Reconciled, Nonce: body.ClaimID})
	switch {
	case errors.Is(err, effects.ErrInProgress):
		s.metrics.Effect(telemetry.EffectInProgress)
		// Come back in a second: an effect usually completes well before its lease ends (the
		// body's lease_until says when the claim lapses at the latest).
		setRetryHeaders(c, retryYes, 1)
		return writeEffect(c, http.StatusConflict, id, e, "in_progress")
	case errors.Is(err, effects.ErrNeedsReconcile):
		s.metrics.Effect(telemetry.EffectNeedsReconcile)
		setRetryHeaders(c, retryNo, 0)
		return writeEffect(c, http.StatusConflict, id, e, "")
	case errors.Is(err, effects.ErrFingerprint):
		s.metrics.Effect(telemetry.EffectConflict)
		return err
	case err != nil:
		return err
	case e.State == effects.Completed:
		s.metrics.Effect(telemetry.EffectReplayed)
		return writeEffect(c, http.StatusOK, id, e, "")
	}
	s.metrics.Effect(telemetry.EffectClaimed)
	return writeEffect(c, http.StatusCreated, id, e, "")
}

// completeEffect is PUT /v1/idempotency/{key}/effects/{name} {"fence", "result"}: the
// holder of fence records the effect's result (any JSON, kept byte for byte). The same
// completion sent again answers the same; a stale fence is 409 effect_stale_fence.
func (s *Server) completeEffect(c *fiber.Ctx) error {
	var body struct {
		Fence  uint64          `json:"fence"`
		Result json.RawMessage `json:"result"`
	}
	if err := decodeEffectBody(c, &body); err != nil {
		return err
	}
	if body.Fence == 0 {
		return errEffectFence
	}
	if len(body.Result) == 0 {
		return errEffectResult
	}
	if len(body.Result) > maxEffectResult {
		return errEffectResultSize
	}
	id, err := s.effectID(c)
	if err != nil {
		return err
	}
	e, err := s.effects.Complete(c.UserContext(), id, body.Fence, body.Result) // Result is the decoder's copy
	return s.answerHolder(c, id, e, err, telemetry.EffectCompleted)
}

// renewEffect is POST /v1/idempotency/{key}/effects/{name}/renew {"fence", "lease_ms"}: the
// holder extends its claim's lease to lease_ms from now (default a minute): 200 claimed.
func (s *Server) renewEffect(c *fiber.Ctx) error {
	id, fence, lease, err := s.holderRequest(c, true)
	if err != nil {
		return err
	}
	e, err := s.effects.Renew(c.UserContext(), id, fence, lease)
	return s.answerHolder(c, id, e, err, telemetry.EffectRenewed)
}

// unknownEffect is POST /v1/idempotency/{key}/effects/{name}/unknown {"fence"}: the holder
// cannot tell whether the effect ran; it needs reconciling before anyone runs it again.
func (s *Server) unknownEffect(c *fiber.Ctx) error {
	id, fence, _, err := s.holderRequest(c, false)
	if err != nil {
		return err
	}
	e, err := s.effects.Unknown(c.UserContext(), id, fence)
	return s.answerHolder(c, id, e, err, telemetry.EffectUnknown)
}

// releaseEffect is POST /v1/idempotency/{key}/effects/{name}/release {"fence"}: the holder
// knows the effect did not run (it failed before reaching anything); the next claim runs it.
func (s *Server) releaseEffect(c *fiber.Ctx) error {
	id, fence, _, err := s.holderRequest(c, false)
	if err != nil {
		return err
	}
	e, err := s.effects.Release(c.UserContext(), id, fence)
	return s.answerHolder(c, id, e, err, telemetry.EffectReleased)
}

// holderRequest reads a holder's request on its claim: {"fence"}, and with withLease
// {"fence", "lease_ms"}.
func (s *Server) holderRequest(c *fiber.Ctx, withLease bool) (effects.ID, uint64, time.Duration, error) {
	var body struct {
		Fence   uint64 `json:"fence"`
		LeaseMS *int64 `json:"lease_ms"`
	}
	if err := decodeEffectBody(c, &body); err != nil {
		return effects.ID{}, 0, 0, err
	}
	if body.LeaseMS != nil && !withLease {
		return effects.ID{}, 0, 0, errEffectBody
	}
	if body.Fence == 0 {
		return effects.ID{}, 0, 0, errEffectFence
	}
	lease, err := s.effectLease(body.LeaseMS)
	if err != nil {
		return effects.ID{}, 0, 0, err
	}
	id, err := s.effectID(c)
	return id, body.Fence, lease, err
}

// answerHolder answers a holder's request: the entry (200, counted as ev), or err.
func (s *Server) answerHolder(c *fiber.Ctx, id effects.ID, e *effects.Entry, err error, ev telemetry.EffectEvent) error {
	if err != nil {
		return s.countFenced(err)
	}
	s.metrics.Effect(ev)
	return writeEffect(c, http.StatusOK, id, e, "")
}

// countFenced counts a holder's write refused for its stale fence, and returns err.
func (s *Server) countFenced(err error) error {
	if errors.Is(err, effects.ErrStaleFence) {
		s.metrics.Effect(telemetry.EffectStaleFence)
	}
	return err
}

// listEffects is GET /v1/idempotency/{key}/effects: the intent's effects, results included.
func (s *Server) listEffects(c *fiber.Ctx) error {
	tenant, recKey, err := s.effectTarget(c)
	if err != nil {
		return err
	}
	list, err := s.effects.List(c.UserContext(), tenant, recKey)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[`)
	for i, e := range list {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := appendEffect(&b, effects.ID{Tenant: tenant, Intent: recKey, Name: e.Name}, e, "", false); err != nil {
			return err
		}
	}
	b.WriteString(`]}`)
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(http.StatusOK).Send(b.Bytes())
}

// effectView is an effect as the API shows it. The fence is shown to its holder (a claim's
// answer) and while the effect needs reconciling (the reconciler completes with it), not to
// a caller told it is in progress.
type effectView struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Attempt     int    `json:"attempt"`
	Fence       uint64 `json:"fence,omitempty"`
	EffectKey   string `json:"effect_key"`
	LeaseUntil  string `json:"lease_until,omitempty"`
	Created     string `json:"created"`
	Updated     string `json:"updated"`
	CompletedAt string `json:"completed_at,omitempty"`
}

// writeEffect answers e with status; state, when set, is the state shown (in_progress).
func writeEffect(c *fiber.Ctx, status int, id effects.ID, e *effects.Entry, state string) error {
	var b bytes.Buffer
	if err := appendEffect(&b, id, e, state, true); err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(status).Send(b.Bytes())
}

// appendEffect writes e's view to b, and its result, when it has one, as the member
// "result" with the bytes the caller recorded (encoding/json would compact them). holder:
// the answer goes to the claim's holder (a claim's or a completion's answer, not a list).
func appendEffect(b *bytes.Buffer, id effects.ID, e *effects.Entry, state string, holder bool) error {
	v := effectView{Name: e.Name, State: string(e.State), Attempt: e.Attempt, EffectKey: id.EffectKey(),
		Created: stamp(e.Created), Updated: stamp(e.Updated), CompletedAt: stamp(e.CompletedAt)}
	if state != "" {
		v.State = state
	}
	switch v.State {
	case string(effects.Claimed):
		v.LeaseUntil = stamp(e.LeaseUntil)
		if holder {
			v.Fence = e.Fence
		}
	case "in_progress":
		v.LeaseUntil = stamp(e.LeaseUntil)
	case string(effects.NeedsReconcile):
		v.Fence = e.Fence
	}
	head, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(e.Result) == 0 {
		b.Write(head)
		return nil
	}
	b.Write(head[:len(head)-1])
	b.WriteString(`,"result":`)
	b.Write(e.Result)
	b.WriteByte('}')
	return nil
}

// stamp is t in RFC 3339 (UTC, nanoseconds), "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
