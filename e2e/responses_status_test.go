package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestResponseStatusFollowsTheExecution: GET /v1/responses/{id} of a background response says
// in_progress from the backend call on (its worker's progress, not the record's first lease
// renewal: issue 34 saw "queued" for ~3.5 s of a running job), completed once it finished; a
// cancelled one reads, in the jobs API, the tokens it had streamed (it read "queued", 0
// tokens). The renewal is set far out so that only the progress can say it runs.
func TestResponseStatusFollowsTheExecution(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.Lease = config.Duration(time.Minute)
	cfg.Idempotency.RenewEvery = config.Duration(20 * time.Second)
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "mock")
	create := func(msg string) string {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"input":%q,"background":true,"mock":{"tokens":40,"inter_token_ms":100}}`, config.MockModel, msg)
		r := do(t, http.MethodPost, gw.URL+"/v1/responses", body, nil)
		var obj struct{ ID, Status string }
		if err := json.Unmarshal(r.Body, &obj); r.Status != http.StatusOK || err != nil || obj.ID == "" {
			t.Fatalf("create: %d %s", r.Status, r.Body)
		}
		return obj.ID
	}
	status := func(id string) string {
		t.Helper()
		r := do(t, http.MethodGet, gw.URL+"/v1/responses/"+id, "", nil)
		var obj struct{ Status string }
		if err := json.Unmarshal(r.Body, &obj); r.Status != http.StatusOK || err != nil {
			t.Fatalf("get %s: %d %s", id, r.Status, r.Body)
		}
		return obj.Status
	}
	inFlight := func() error {
		if n := mock.Stats().InFlight; n != 1 {
			return fmt.Errorf("%d backend calls in flight, want 1", n)
		}
		return nil
	}

	id := create("status follows the execution")
	testkit.CheckFor(t, 10*time.Second, pollEvery, inFlight)
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if err := inFlight(); err != nil {
			t.Fatalf("the call ended before the response read in_progress (%v): still %q", err, status(id))
		}
		if s := status(id); s != "in_progress" {
			return fmt.Errorf("status %q while the backend call runs, want in_progress", s)
		}
		return nil
	})
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		if s := status(id); s != "completed" {
			return fmt.Errorf("status %q, want completed", s)
		}
		return nil
	})

	cancelled := create("cancelled while it streams")
	job := cancelled[len("resp_"):]
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		var st struct {
			Tokens int `json:"tokens_so_far"`
		}
		r := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+job, "", nil)
		if err := json.Unmarshal(r.Body, &st); err != nil || st.Tokens < 3 {
			return fmt.Errorf("job %s: %d %s, want a few tokens out", job, r.Status, r.Body)
		}
		return nil
	})
	if r := do(t, http.MethodPost, gw.URL+"/v1/responses/"+cancelled+"/cancel", "", nil); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	var st struct {
		Status   string
		Progress string
		Tokens   int `json:"tokens_so_far"`
	}
	r := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+job, "", nil)
	if err := json.Unmarshal(r.Body, &st); err != nil || st.Status != "cancelled" || st.Progress == "queued" || st.Tokens < 3 {
		t.Fatalf("cancelled job: %d %s; want cancelled, with the tokens it streamed", r.Status, r.Body)
	}
}
