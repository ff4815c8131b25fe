package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// anthropicMessage is the part of an Anthropic Message the tests read.
type anthropicMessage struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StopReason string `json:"stop_reason"`
	Usage      struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func (m anthropicMessage) text() string {
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// isAnthropicInvalid reports whether b is an Anthropic invalid_request_error body with a
// message.
func isAnthropicInvalid(b []byte) bool {
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(b, &e) == nil && e.Type == "error" && e.Error.Type == "invalid_request_error" && e.Error.Message != ""
}

// TestJobsAPIAnthropic: POST /v1/jobs with an anthropic-version header takes an Anthropic
// Messages body: 202, then the job's result, events and errors in the Anthropic format, from
// the mock's Messages API; it is the same intent as the identical POST /v1/messages. Without
// the header the body is read as OpenAI's.
func TestJobsAPIAnthropic(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	anth := map[string]string{"anthropic-version": "2023-06-01"}
	with := func(kv ...string) map[string]string {
		h := map[string]string{"anthropic-version": "2023-06-01"}
		for i := 0; i+1 < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	body := `{"model":"oncegate-mock","max_tokens":8,"system":"be brief","messages":[{"role":"user","content":"an anthropic background job"}]}`
	waitCompleted := func(id string) job {
		t.Helper()
		var j job
		testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
			var r result
			if j, r = getJob(t, gw.URL, id); j.Status != "completed" {
				return fmt.Errorf("job %s: %d %s", id, r.Status, r.Body)
			}
			return nil
		})
		return j
	}

	t.Run("202, result and events in the Anthropic format", func(t *testing.T) {
		before := mock.Stats().Requests
		r := do(t, http.MethodPost, gw.URL+"/v1/jobs", body, with("Idempotency-Key", "anth-job-1"))
		expect(t, r, http.StatusAccepted, "created")
		var accepted struct{ ID, Object, Status string }
		if err := json.Unmarshal(r.Body, &accepted); err != nil || accepted.Object != "job" {
			t.Fatalf("202 body %s: %v", r.Body, err)
		}
		j := waitCompleted(accepted.ID)
		var msg anthropicMessage
		if err := json.Unmarshal(j.Result, &msg); err != nil {
			t.Fatalf("result %s: %v", j.Result, err)
		}
		if msg.Type != "message" || msg.Role != "assistant" || msg.text() == "" || msg.Usage.OutputTokens != 8 || msg.StopReason != "max_tokens" {
			t.Fatalf("result is not the mock's Anthropic message: %s", j.Result)
		}

		ev := do(t, http.MethodGet, gw.URL+"/v1/jobs/"+accepted.ID+"/events", "", nil)
		expectStatus(t, ev, http.StatusOK)
		events, err := sseEvents(ev.Body)
		if err != nil || len(events) < 4 {
			t.Fatalf("events: %v: %s", err, ev.Body)
		}
		var text strings.Builder
		for i, e := range events {
			if e.ID != fmt.Sprint(i) || e.Data == "[DONE]" {
				t.Errorf("event %d: id %q data %q", i, e.ID, e.Data)
			}
			var d struct {
				Type  string `json:"type"`
				Delta struct {
					Text string `json:"text"`
				} `json:"delta"`
			}
			if err := json.Unmarshal([]byte(e.Data), &d); err != nil || d.Type != e.Event {
				t.Errorf("event %d is not an Anthropic event (event %q, data %s)", i, e.Event, e.Data)
			}
			if d.Type == "content_block_delta" {
				text.WriteString(d.Delta.Text)
			}
		}
		if first, last := events[0].Event, events[len(events)-1].Event; first != "message_start" || last != "message_stop" {
			t.Errorf("events run %s … %s, want message_start … message_stop", first, last)
		}
		if text.String() != msg.text() {
			t.Errorf("events' text %q, result's %q", text.String(), msg.text())
		}

		// The same intent as POST /v1/messages with that key: its stored answer, no new execution.
		m := do(t, http.MethodPost, gw.URL+"/v1/messages", body, with("Idempotency-Key", "anth-job-1"))
		expect(t, m, http.StatusOK, "replayed")
		if !compactEqual(m.Body, j.Result) {
			t.Errorf("POST /v1/messages answer %s differs from the job's result %s", m.Body, j.Result)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	t.Run("keyless: the auto key of POST /v1/messages", func(t *testing.T) {
		before := mock.Stats().Requests
		keyless := `{"model":"oncegate-mock","max_tokens":6,"messages":[{"role":"user","content":"a keyless anthropic job"}]}`
		r := do(t, http.MethodPost, gw.URL+"/v1/jobs", keyless, anth)
		expect(t, r, http.StatusAccepted, "created")
		want, err := autoKey("anonymous", "/v1/messages", []byte(keyless))
		if err != nil || r.Header.Get("Idempotency-Key") != want {
			t.Errorf("Idempotency-Key = %q, want the auto key of POST /v1/messages %q (%v)", r.Header.Get("Idempotency-Key"), want, err)
		}
		m := do(t, http.MethodPost, gw.URL+"/v1/messages", keyless, anth)
		if o := m.Header.Get("Oncegate-Idempotency"); m.Status != http.StatusOK || (o != "joined" && o != "replayed") {
			t.Fatalf("POST /v1/messages: %d %q %s, want the job's execution", m.Status, o, m.Body)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	t.Run("errors are Anthropic's and change nothing", func(t *testing.T) {
		before := mock.Stats().Requests
		for _, tc := range []struct{ name, body string }{
			{"no max_tokens", `{"model":"oncegate-mock","messages":[{"role":"user","content":"x"}]}`},
			{"no messages", `{"model":"oncegate-mock","max_tokens":8}`},
			{"not JSON", `{"model":`},
		} {
			r := do(t, http.MethodPost, gw.URL+"/v1/jobs", tc.body, anth)
			if r.Status != http.StatusBadRequest || !isAnthropicInvalid(r.Body) {
				t.Errorf("%s: %d %s, want a 400 Anthropic error", tc.name, r.Status, r.Body)
			}
		}
		if n := mock.Stats().Requests - before; n != 0 {
			t.Errorf("backend executions = %d, want 0", n)
		}
	})

	t.Run("without anthropic-version the body is OpenAI's", func(t *testing.T) {
		r := do(t, http.MethodPost, gw.URL+"/v1/jobs", body, map[string]string{"Idempotency-Key": "anth-job-openai"})
		expect(t, r, http.StatusAccepted, "created")
		var accepted struct{ ID string }
		_ = json.Unmarshal(r.Body, &accepted)
		j := waitCompleted(accepted.ID)
		var c struct {
			Object string `json:"object"`
		}
		if err := json.Unmarshal(j.Result, &c); err != nil || c.Object != "chat.completion" {
			t.Errorf("result %s, want a chat completion", j.Result)
		}
	})
}
