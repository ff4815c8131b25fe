package httpapi

import (
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
)

// dedupReasonHeader is the opt-in "why was this request deduplicated?" header (issue 37). A
// request asks for it by sending it with the value "true" (or "?1"); a joined or replayed
// answer then carries it as an RFC 8941 dictionary:
//
//	Oncegate-Dedup-Reason: rule=auto_key_window, job="01J…", arrived="2026-…Z"
//	Oncegate-Dedup-Reason: rule=sdk_retry_header, header="x-stainless-retry-count", job="01J…", arrived="…"
//
// Opt-in per request rather than by a config switch: an operator or a client debugging one
// call asks for it with curl, no restart, and every other answer keeps exactly the headers it
// had (an SDK or a cache that compares responses sees no change).
const dedupReasonHeader = "Oncegate-Dedup-Reason"

// wantsDedupReason reports whether the request asked for the dedup reason header.
func wantsDedupReason(c *fiber.Ctx) bool {
	v := strings.TrimSpace(c.Get(dedupReasonHeader))
	return v == "?1" || strings.EqualFold(v, "true") || v == "1"
}

// dedupReason is the header's value for d.
func dedupReason(d *intent.Dedup) string {
	var b strings.Builder
	b.WriteString("rule=")
	b.WriteString(string(d.Rule))
	if d.Header != "" {
		b.WriteString(", header=")
		b.WriteString(strconv.Quote(strings.ToLower(d.Header)))
	}
	b.WriteString(", job=")
	b.WriteString(strconv.Quote(d.JobID))
	b.WriteString(", arrived=")
	b.WriteString(strconv.Quote(d.Arrived.UTC().Format(time.RFC3339Nano)))
	return b.String()
}

// dedupView is the "dedup" member of the status API (GET /v1/idempotency/{key}, GET
// /v1/jobs/{id}): a status query names a key, not a request, so it says which execution the
// copies of that key attach to, when its first request arrived, and the rules by which a
// later request is taken for a copy of it (the header above names the one that matched).
type dedupView struct {
	JobID   string `json:"job_id"`
	Arrived string `json:"arrived"`
	// Rules: ["idempotency_key"] for a client's key; ["auto_key_window", "sdk_retry_header",
	// "retry_header"] for an auto key (the window until WindowUntil, a declared retry for the
	// TTL); ["sdk_retry_header", "retry_header"] for a bypassed request paired with its retry.
	// "retry_header" only when idempotency.retry_headers names some: only rules that apply.
	Rules       []intent.Rule `json:"rules"`
	WindowUntil string        `json:"auto_window_until,omitempty"`
}

// dedupOf is the status API's dedup member of job.
func (s *Server) dedupOf(job *intent.View) *dedupView {
	v := &dedupView{JobID: job.ID, Arrived: job.Arrived.UTC().Format(time.RFC3339Nano)}
	switch {
	case job.Bypassed:
		v.Rules = s.retryRules(nil)
	case job.Auto:
		v.Rules = s.retryRules([]intent.Rule{intent.RuleAutoWindow})
		v.WindowUntil = job.Created.Add(s.idem.AutoWindow.D()).UTC().Format(time.RFC3339Nano)
	default:
		v.Rules = []intent.Rule{intent.RuleIdempotencyKey}
	}
	return v
}

// retryRules is rules and the rules by which a declared retry matches: the SDKs' retry count
// always, idempotency.retry_headers when it names any.
func (s *Server) retryRules(rules []intent.Rule) []intent.Rule {
	rules = append(rules, intent.RuleSDKRetry)
	if len(s.idem.RetryHeaders) > 0 {
		rules = append(rules, intent.RuleRetryHeader)
	}
	return rules
}
