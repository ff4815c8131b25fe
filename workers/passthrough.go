package workers

import (
	"context"
	"net/http"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// A passthrough execution (a path a backend lists in its passthrough, see the README) is a
// non-stream execution whose answer is not a chat completion: any 2xx, or a final 4xx, is the
// outcome, stored with its status, body and Content-Type, and replayed as it is.

// passthroughSuccess: a passthrough backend's 2xx other than 200 (201, 202…) is its answer
// too, never a refusal to retry.
func (ex *execution) passthroughSuccess(code int) bool {
	return ex.job.API == backend.APIPassthrough && code >= 200 && code < 300
}

// finishPassthrough stores a passthrough answer: status, body and Content-Type as the
// backend sent them, and the usage when the body reports OpenAI usage.
func (ex *execution) finishPassthrough(ctx context.Context, ans *answer) {
	body, ok := ex.readAnswer(ctx, ans)
	if !ok {
		return
	}
	res := &kv.Result{Status: ans.resp.StatusCode, Body: body, ContentType: ans.resp.Header.Get("Content-Type")}
	if u := openaiwire.UsageOf(body); u != nil && ans.resp.StatusCode == http.StatusOK {
		res.Usage = &kv.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	}
	m := ex.meta()
	m.ContentType = res.ContentType
	ex.pub.SetMeta(m)
	ex.finishCompleted(ctx, res, jobs.KindResult)
}
