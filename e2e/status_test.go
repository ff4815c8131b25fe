package e2e

// What the status API reports while an execution runs and after it ended (issue 10, "The
// state it reports"): clients "ask before they retry", so it must say running from the send,
// with the attempt and the backend, and what the outcome truly was.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestStatusShowsRunningWhileGenerating: while a 2 s non-stream generation runs, both
// GET /v1/idempotency/{key} and GET /v1/jobs/{id} say running, attempt 1, the backend, and
// they say it while the request is still waiting for its answer (before, a non-stream
// execution read queued with 0 attempts for its whole run). Once completed, tokens_so_far is
// the usage's completion tokens (it was 0 for non-stream records).
func TestStatusShowsRunningWhileGenerating(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	const key = "status-running-1"
	hdr := map[string]string{"Idempotency-Key": key}
	// 16 tokens at 125 ms each: about 2 s of generation.
	body := chatBody(slowModel, "report me running", `"mock":{"inter_token_ms":125}`)
	resCh := async(func() result { return send(http.MethodPost, gw.URL+chatPath, body, hdr) })
	var res *result
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
	// Polls until the status says running or the answer came (then seen stays nil).
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if answered() {
			return nil
		}
		r := send(http.MethodGet, gw.URL+"/v1/idempotency/"+key, "", nil)
		if r.Status != http.StatusOK {
			return fmt.Errorf("the key is not claimed yet: %d %s", r.Status, r.Body)
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatalf("idempotency status is not JSON: %s", r.Body)
		}
		if m["job_status"] == "running" && !answered() {
			seen = m
			return nil
		}
		return fmt.Errorf("the status API does not say running: %s", r.Body)
	})
	if seen == nil {
		t.Fatalf("the status API never said running while the request waited for its answer (answered: %v)", answered())
	}
	if seen["state"] != "PENDING" || seen["attempts"] != float64(1) || seen["backend"] != "slowmock" || seen["sent"] == nil {
		t.Fatalf("idempotency status while running = %v; want PENDING, attempts 1, backend slowmock, sent", seen)
	}
	id, _ := seen["job_id"].(string)
	j, jr := getJob(t, gw.URL, id)
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
	expect(t, r, http.StatusOK, "created")
	var answer struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.Body, &answer); err != nil || answer.Usage.CompletionTokens == 0 {
		t.Fatalf("answer without usage: %s", r.Body)
	}
	after := idemStatus(t, gw.URL, key, nil)
	if after["state"] != "COMPLETED" || after["tokens_so_far"] != float64(answer.Usage.CompletionTokens) || after["attempts"] != float64(1) {
		t.Fatalf("idempotency status after completion = %v; want COMPLETED, tokens_so_far %d, attempts 1", after, answer.Usage.CompletionTokens)
	}
	j, jr = getJob(t, gw.URL, id)
	if j.Status != "completed" || j.Tokens != answer.Usage.CompletionTokens {
		t.Fatalf("job view after completion: %s; want completed, tokens_so_far %d", jr.Body, answer.Usage.CompletionTokens)
	}
}

// TestStatusOfPartialStreamFailure: a stream that broke after output (and could not be
// continued) is FAILED with its partial output kept; its status view must not say
// "status":200 as if it had succeeded: it says 502, partial, and the error.
func TestStatusOfPartialStreamFailure(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	const key = "status-partial-1"
	body := chatBody("oncegate-mock", "break after three", `"stream":true,"mock":{"fault":"drop_after","fault_after":3}`)
	r := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	if r.Err != nil || r.Status != http.StatusOK {
		t.Fatalf("stream: %d %v %s", r.Status, r.Err, r.Body)
	}
	m := idemStatus(t, gw.URL, key, nil)
	errObj, _ := m["error"].(map[string]any)
	if m["state"] != "FAILED" || m["status"] != float64(http.StatusBadGateway) || m["partial"] != true || errObj["code"] != "stream_interrupted" {
		t.Fatalf("status of a partial stream failure = %v; want FAILED, status 502, partial, error stream_interrupted", m)
	}
}

// TestCancelledRunningJobIsCountedAndCharged: DELETE /v1/jobs/{id} while the backend runs the
// job. The provider bills the attempt whatever the gateway does next, so the record counts it
// (attempts 1, before: 0) and the ledger has exactly one entry for the job, estimated (before:
// none, the cancel fenced the worker before it could charge anything).
func TestCancelledRunningJobIsCountedAndCharged(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Ledger.Prices = map[string]config.Price{"*": {InputPerMillion: 1_000_000, OutputPerMillion: 1_000_000}}
	cfg.Admin.APIKeysSHA256 = []string{sha("admin-key")}
	gw := gatewaykit.StartGateway(t, cfg)
	const key = "cancel-running-1"
	// 16 tokens at 250 ms each: about 4 s, past the first lease renewal that notices the cancel.
	body := chatBody(slowModel, "cancel me while I run", `"mock":{"inter_token_ms":250}`)
	r := do(t, http.MethodPost, gw.URL+"/v1/jobs", body, map[string]string{"Idempotency-Key": key})
	if r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs: %d %s", r.Status, r.Body)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(r.Body, &created); err != nil || created.ID == "" {
		t.Fatalf("POST /v1/jobs body: %s", r.Body)
	}
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if j, jr := getJob(t, gw.URL, created.ID); j.Status != "running" {
			return fmt.Errorf("the job does not read running: %d %s", jr.Status, jr.Body)
		}
		return nil
	})
	if r := send(http.MethodDelete, gw.URL+"/v1/jobs/"+created.ID, "", nil); r.Status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", r.Status, r.Body)
	}
	m := idemStatus(t, gw.URL, key, nil)
	if m["cancelled"] != true || m["attempts"] != float64(1) {
		t.Fatalf("status after the cancel = %v; want cancelled, attempts 1", m)
	}
	if j, jr := getJob(t, gw.URL, created.ID); j.Status != "cancelled" || j.Attempts != 1 {
		t.Fatalf("job after the cancel: %s; want cancelled, attempts 1", jr.Body)
	}

	admin := map[string]string{"Authorization": "Bearer admin-key"}
	type entry struct {
		Kind      string `json:"kind"`
		JobID     string `json:"job_id"`
		Estimated bool   `json:"estimated"`
		Completed bool   `json:"completed"`
	}
	ofJob := func() []entry {
		r := send(http.MethodGet, gw.URL+"/v1/admin/ledger", "", admin)
		var list struct {
			Data []entry `json:"data"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &list) != nil {
			t.Fatalf("admin ledger: %d %s", r.Status, r.Body)
		}
		var out []entry
		for _, e := range list.Data {
			if e.JobID == created.ID {
				out = append(out, e)
			}
		}
		return out
	}
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if len(ofJob()) == 0 {
			return errors.New("the cancelled job's attempt is not charged")
		}
		return nil
	})
	// The worker that was running it stops at its next renewal: wait for the backend call
	// to end, then the charge must still be the only one.
	mock := gw.Mock(t, "slowmock")
	testkit.CheckFor(t, 30*time.Second, pollEvery, inFlight(mock, 0))
	if es := ofJob(); len(es) != 1 || es[0].Kind != "charge" || !es[0].Estimated || es[0].Completed {
		t.Fatalf("ledger entries of the cancelled job = %+v; want one estimated, not completed charge", es)
	}
}
