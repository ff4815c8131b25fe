package e2e

// What the status API reports while an execution runs and after it ended (issue 10, "The
// state it reports"): clients "ask before they retry", so it must say running from the send,
// with the attempt and the backend, and what the outcome truly was.

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/internal/gwtest"
)

// TestStatusShowsRunningWhileGenerating: while a 2 s non-stream generation runs, both
// GET /v1/idempotency/{key} and GET /v1/jobs/{id} say running, attempt 1, the backend, and
// they say it while the request is still waiting for its answer (before, a non-stream
// execution read queued with 0 attempts for its whole run). Once completed, tokens_so_far is
// the usage's completion tokens (it was 0 for non-stream records).
func TestStatusShowsRunningWhileGenerating(t *testing.T) {
	gw := gwtest.Start(t, nil)
	c := xoClient(t)
	const key = "status-running-1"
	hdr := map[string]string{"Idempotency-Key": key}
	// 16 tokens at 125 ms each: about 2 s of generation.
	body := xoChatBody(xoSlowModel, "report me running", false, `"mock":{"inter_token_ms":125}`)
	resCh := xoGo(func() xoResult { return xoPost(c, gw.URL+xoChatPath, body, hdr) })
	var res *xoResult
	answered := func() bool {
		if res == nil {
			select {
			case r := <-resCh:
				res = &r
			default:
			}
		}
		return res != nil
	}

	var seen map[string]any
	if !xoPoll(30e9, func() bool {
		if answered() {
			return true
		}
		r := xoDo(c, http.MethodGet, gw.URL+"/v1/idempotency/"+key, "", nil)
		if r.Status != http.StatusOK {
			return false // not claimed yet
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatalf("idempotency status is not JSON: %s", r.Body)
		}
		if m["job_status"] == "running" && !answered() {
			seen = m
			return true
		}
		return false
	}) || seen == nil {
		t.Fatalf("the status API never said running while the request waited for its answer (answered: %v)", answered())
	}
	if seen["state"] != "PENDING" || seen["attempts"] != float64(1) || seen["backend"] != "slowmock" || seen["sent"] == nil {
		t.Fatalf("idempotency status while running = %v; want PENDING, attempts 1, backend slowmock, sent", seen)
	}
	id, _ := seen["job_id"].(string)
	j, jr := xoGetJob(t, c, gw.URL, id)
	if !answered() { // read after the answer, it would prove nothing about running
		if jr.Status != http.StatusOK || j.Status != "running" || j.Attempts != 1 {
			t.Fatalf("job view while running: %d %s; want running, attempts 1", jr.Status, jr.Body)
		}
	}
	if !answered() {
		r := <-resCh
		res = &r
	}
	r := *res
	xoWant(t, r, http.StatusOK, "created")
	var answer struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.Body, &answer); err != nil || answer.Usage.CompletionTokens == 0 {
		t.Fatalf("answer without usage: %s", r.Body)
	}
	after := xoIdem(t, c, gw.URL, key, nil)
	if after["state"] != "COMPLETED" || after["tokens_so_far"] != float64(answer.Usage.CompletionTokens) || after["attempts"] != float64(1) {
		t.Fatalf("idempotency status after completion = %v; want COMPLETED, tokens_so_far %d, attempts 1", after, answer.Usage.CompletionTokens)
	}
	j, jr = xoGetJob(t, c, gw.URL, id)
	if j.Status != "completed" || j.Tokens != answer.Usage.CompletionTokens {
		t.Fatalf("job view after completion: %s; want completed, tokens_so_far %d", jr.Body, answer.Usage.CompletionTokens)
	}
}

// TestStatusOfPartialStreamFailure: a stream that broke after output (and could not be
// continued) is FAILED with its partial output kept; its status view must not say
// "status":200 as if it had succeeded: it says 502, partial, and the error.
func TestStatusOfPartialStreamFailure(t *testing.T) {
	gw := gwtest.Start(t, nil)
	c := xoClient(t)
	const key = "status-partial-1"
	body := xoChatBody("oncegate-mock", "break after three", true, `"mock":{"fault":"drop_after","fault_after":3}`)
	r := xoPost(c, gw.URL+xoChatPath, body, map[string]string{"Idempotency-Key": key})
	if r.Err != nil || r.Status != http.StatusOK {
		t.Fatalf("stream: %d %v %s", r.Status, r.Err, r.Body)
	}
	m := xoIdem(t, c, gw.URL, key, nil)
	errObj, _ := m["error"].(map[string]any)
	if m["state"] != "FAILED" || m["status"] != float64(http.StatusBadGateway) || m["partial"] != true || errObj["code"] != "stream_interrupted" {
		t.Fatalf("status of a partial stream failure = %v; want FAILED, status 502, partial, error stream_interrupted", m)
	}
}
