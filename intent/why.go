package intent

import (
	"time"

	"github.com/oncegate/oncegate/kv"
)

// Rule names the rule by which a request was found to be a copy of an earlier one (issue 37,
// "why was this request deduplicated?"). It is taken from the decision itself (match), never
// worked out again afterwards.
type Rule string

// Rules.
const (
	// RuleIdempotencyKey: the client sent the same Idempotency-Key (or X-Idempotency-Key).
	RuleIdempotencyKey Rule = "idempotency_key"
	// RuleAutoWindow: no key was sent, and the identical request arrived within
	// idempotency.auto_window of the first.
	RuleAutoWindow Rule = "auto_key_window"
	// RuleSDKRetry: the request carried an official SDK's x-stainless-retry-count, either as
	// a retry of an auto-keyed request (any time within the TTL) or on a bypassed request
	// (X-Allow-Duplicate) whose attempt and retry were paired (bypass.go).
	RuleSDKRetry Rule = "sdk_retry_header"
	// RuleRetryHeader: as RuleSDKRetry, by one of idempotency.retry_headers.
	RuleRetryHeader Rule = "retry_header"
)

// SDKRetryHeader is the official SDKs' retry count header.
const SDKRetryHeader = "x-stainless-retry-count"

// Dedup says why a joined or replayed request was deduplicated: which earlier execution it
// was attached to, when that execution's first request arrived, and by which rule.
type Dedup struct {
	Rule Rule
	// Header is the retry header that matched (RuleSDKRetry, RuleRetryHeader), as configured.
	Header string
	// JobID is the earlier execution's job.
	JobID string
	// Arrived is when the request that started it reached the gateway.
	Arrived time.Time
}

// match is the rule by which req, arrived at at, is a copy of rec, the record its key already
// has; "" when it is not a copy (an auto key past its window, sent as no retry: a new intent).
// The caller has checked tenant and fingerprint.
func (c *Core) match(req *Request, rec *kv.Record, at time.Time) Rule {
	switch {
	case req.ContentKey != "": // a bypassed request paired with its attempt or retry
		return retryRule(req.RetryHeader)
	case !req.Auto:
		return RuleIdempotencyKey
	case req.Retry: // a declared retry matches for the whole TTL, window or not
		return retryRule(req.RetryHeader)
	case at.Sub(rec.Created) <= c.opts.AutoWindow:
		return RuleAutoWindow
	}
	return ""
}

func retryRule(header string) Rule {
	if header == SDKRetryHeader {
		return RuleSDKRetry
	}
	return RuleRetryHeader
}

// explain gives adm, when it joined or replayed rec, the reason rule.
func explain(adm *Admission, rule Rule, header string, rec *kv.Record) *Admission {
	if adm == nil || rule == "" || (adm.Outcome != Joined && adm.Outcome != Replayed) {
		return adm
	}
	d := &Dedup{Rule: rule, JobID: rec.JobID, Arrived: rec.FirstArrived()}
	if rule == RuleSDKRetry || rule == RuleRetryHeader {
		d.Header = header
	}
	adm.Dedup = d
	return adm
}
