package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
)

// compactEqual reports whether a and b are the same JSON text once compacted.
func compactEqual(a, b []byte) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// TestJobsAPI: a long generation as a background job, created by POST /v1/jobs or by
// Prefer: respond-async: 202 with its Location; its status moves from running to completed
// with the same answer a chat request of the same key gets; its events replay from the start
// with ids 0..n and [DONE] last, identical live and afterwards; Last-Event-ID and
// ?starting_after=k resume exactly after k; a client that has everything gets 204.
func TestJobsAPI(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.RenewEvery = config.Duration(100 * time.Millisecond) // progress reaches the record every 100 ms
	gw := gatewaykit.StartGateway(t, cfg)
	slow := gw.Mock(t, "slowmock")

	for i, tc := range []struct {
		name, path string
		hdr        map[string]string
	}{
		{"POST /v1/jobs", "/v1/jobs", nil},
		{"Prefer respond-async", chatPath, map[string]string{"Prefer": "respond-async"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("xo-job-%d", i)
			const tokens = 30
			body := chatBody(slowModel, "a background job "+tc.name, fmt.Sprintf(`"mock":{"tokens":%d,"inter_token_ms":30}`, tokens))
			_, wantContent := reference(t, body)
			hdr := map[string]string{"Idempotency-Key": key}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			before := slow.Stats().Requests

			r := do(t, http.MethodPost, gw.URL+tc.path, body, hdr)
			expect(t, r, http.StatusAccepted, "created")
			var accepted struct{ ID, Object, Status string }
			if err := json.Unmarshal(r.Body, &accepted); err != nil || !jobs.ParseID(accepted.ID) || accepted.Object != "job" ||
				(accepted.Status != "queued" && accepted.Status != "running") {
				t.Fatalf("202 body %s (%v): want {id, object: job, status: queued|running}", r.Body, err)
			}
			id := accepted.ID
			if loc := r.Header.Get("Location"); loc != "/v1/jobs/"+id {
				t.Errorf("Location = %q, want /v1/jobs/%s", loc, id)
			}
			if got := r.Header.Get("Oncegate-Job-Id"); got != id {
				t.Errorf("Oncegate-Job-Id = %q, want %s", got, id)
			}

			// Running: status and the key's state show progress.
			testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
				if j, jr := getJob(t, gw.URL, id); j.Status != "running" || j.Tokens == 0 {
					return fmt.Errorf("the job is not running with tokens so far: %d %s", jr.Status, jr.Body)
				}
				return nil
			})
			during := idemStatus(t, gw.URL, key, nil)
			if during["state"] != "PENDING" || during["job_id"] != id || during["epoch"] != 1.0 || during["attempts"] != 1.0 ||
				during["tokens_so_far"].(float64) <= 0 {
				t.Errorf("key status while running: %v", during)
			}

			// Events while running: replayed from the start, then live, to [DONE].
			live := send(http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", nil)
			if live.Status != http.StatusOK || !strings.HasPrefix(live.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("live events: %d %s", live.Status, live.Body)
			}

			testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
				if j, jr := getJob(t, gw.URL, id); j.Status != "completed" {
					return fmt.Errorf("the job has not completed: %d %s", jr.Status, jr.Body)
				}
				return nil
			})
			j, jr := getJob(t, gw.URL, id)
			if j.ID != id || j.Object != "job" || j.Epoch != 1 || j.Attempts != 1 || len(j.Error) != 0 {
				t.Errorf("completed job: %s", jr.Body)
			}
			_, content, err := answerOf(j.Result)
			if err != nil || content != wantContent {
				t.Errorf("job result %q (%v), want %q", content, err, wantContent)
			}
			chat := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
			expect(t, chat, http.StatusOK, "replayed")
			if !compactEqual(j.Result, chat.Body) {
				t.Errorf("job result differs from the chat answer of the same key:\n job %s\nchat %s", j.Result, chat.Body)
			}
			after := idemStatus(t, gw.URL, key, nil)
			if after["state"] != "COMPLETED" || after["job_id"] != id || after["epoch"] != 1.0 || after["attempts"] != 1.0 ||
				after["tokens_so_far"].(float64) < tokens {
				t.Errorf("key status after completion: %v", after)
			}

			// Replay from the start: ids 0..n-1, [DONE] last, same bytes as live.
			full := send(http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", nil)
			if full.Status != http.StatusOK {
				t.Fatalf("events: %d %s", full.Status, full.Body)
			}
			evs, err := sseEvents(full.Body)
			if err != nil {
				t.Fatal(err)
			}
			for k, ev := range evs {
				if !ev.HasID || ev.ID != strconv.Itoa(k) {
					t.Fatalf("event %d has id %q, want %d", k, ev.ID, k)
				}
			}
			n := len(evs)
			if n < tokens+2 || evs[n-1].Data != "[DONE]" {
				t.Fatalf("events: %d, last %q; want the role chunk, %d tokens, the finish chunk… then [DONE]", n, evs[n-1].Data, tokens)
			}
			var sb strings.Builder
			for _, ev := range evs[:n-1] {
				sb.WriteString("data: " + ev.Data + "\n\n")
			}
			st, err := parseChatStream([]byte(sb.String() + "data: [DONE]\n\n"))
			if err != nil || st.Content != wantContent {
				t.Errorf("events transcript %q (%v), want %q", st.Content, err, wantContent)
			}
			if !bytes.Equal(live.Body, full.Body) {
				t.Errorf("events read live differ from the replay:\n live %q\nreplay %q", live.Body, full.Body)
			}

			// Resume after k: exactly the events k+1.., byte for byte.
			blocks := eventBlocks(t, full.Body)
			for _, k := range []int{-1, 0, 1, n / 2, n - 2, n - 1, n + 5} {
				for _, how := range []string{"Last-Event-ID", "starting_after"} {
					var res result
					if how == "Last-Event-ID" {
						res = send(http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": strconv.Itoa(k)})
					} else {
						res = send(http.MethodGet, fmt.Sprintf("%s/v1/jobs/%s/events?starting_after=%d", gw.URL, id, k), "", nil)
					}
					if k >= n-1 {
						if res.Status != http.StatusNoContent || len(res.Body) != 0 {
							t.Errorf("%s %d (everything delivered): %d %q, want 204", how, k, res.Status, res.Body)
						}
						continue
					}
					want := strings.Join(blocks[k+1:], "")
					if res.Status != http.StatusOK || string(res.Body) != want {
						t.Errorf("%s %d: %d\n got %q\nwant %q", how, k, res.Status, tail(res.Body), tail([]byte(want)))
					}
				}
			}
			if got := slow.Stats().Requests - before; got != 1 {
				t.Errorf("backend executions = %d, want 1", got)
			}
		})
	}

	t.Run("resume while running", func(t *testing.T) {
		body := chatBody(slowModel, "resume live", `"mock":{"tokens":30,"inter_token_ms":30}`)
		r := do(t, http.MethodPost, gw.URL+"/v1/jobs", body, map[string]string{"Idempotency-Key": "xo-job-resume-live"})
		expect(t, r, http.StatusAccepted, "created")
		id := r.Header.Get("Oncegate-Job-Id")
		testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
			if j, jr := getJob(t, gw.URL, id); j.Status != "running" || j.Tokens <= 3 {
				return fmt.Errorf("the job is not running with more than 3 tokens: %d %s", jr.Status, jr.Body)
			}
			return nil
		})
		resumed := send(http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": "2"})
		full := send(http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", nil)
		blocks := eventBlocks(t, full.Body)
		if len(blocks) < 4 || string(resumed.Body) != strings.Join(blocks[3:], "") {
			t.Errorf("live resume after 2:\n got %q\nwant %q", resumed.Body, strings.Join(blocks[min(3, len(blocks)):], ""))
		}
	})

	// DELETE of a running job: cancelled, the backend call stops, followers get an error event.
	t.Run("cancel", func(t *testing.T) {
		const key = "xo-job-cancel"
		body := chatBody(slowModel, "cancel me", `"mock":{"tokens":2000,"inter_token_ms":10}`) // 20 s
		before := slow.Stats().Requests
		r := do(t, http.MethodPost, gw.URL+"/v1/jobs", body, map[string]string{"Idempotency-Key": key})
		expect(t, r, http.StatusAccepted, "created")
		id := r.Header.Get("Oncegate-Job-Id")
		testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
			if j, jr := getJob(t, gw.URL, id); j.Status != "running" || slow.Stats().InFlight == 0 {
				return fmt.Errorf("the job does not run (backend calls in flight: %d): %d %s", slow.Stats().InFlight, jr.Status, jr.Body)
			}
			return nil
		})

		// Two followers: the job's events, and a streamed chat copy of the same key.
		evc := async(func() result { return send(http.MethodGet, gw.URL+"/v1/jobs/"+id+"/events", "", nil) })
		chatResp, err := openStream(http.MethodPost, gw.URL+chatPath, chatBody(slowModel, "cancel me", `"stream":true,"mock":{"tokens":2000,"inter_token_ms":10}`),
			map[string]string{"Idempotency-Key": key})
		if err != nil {
			t.Fatal(err)
		}
		defer chatResp.Body.Close()
		cr := newSSEReader(chatResp.Body)
		if _, err := cr.next(); err != nil {
			t.Fatalf("chat follower: %v", err)
		}

		del := send(http.MethodDelete, gw.URL+"/v1/jobs/"+id, "", nil)
		if del.Status != http.StatusOK || !bytes.Contains(del.Body, []byte(`"status":"cancelled"`)) {
			t.Fatalf("DELETE: %d %s", del.Status, del.Body)
		}
		testkit.CheckFor(t, 10*time.Second, pollEvery, inFlight(slow, 0))

		if st, err := parseChatStream(cr.drain()); err != nil || st.Done || st.ErrCode != "job_cancelled" {
			t.Errorf("chat follower: error %q done %v (%v); want a job_cancelled error event and no [DONE]", st.ErrCode, st.Done, err)
		}
		ev := <-evc
		evs, err := sseEvents(ev.Body)
		if err != nil || len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Data, `"job_cancelled"`) {
			t.Errorf("events follower: %v, last event %q; want a job_cancelled error event", err, tail(ev.Body))
		}
		for _, e := range evs {
			if e.Data == "[DONE]" {
				t.Errorf("events follower got [DONE] after a cancel")
			}
		}

		j, jr := getJob(t, gw.URL, id)
		if j.Status != "cancelled" || len(j.Error) == 0 || len(j.Result) != 0 {
			t.Errorf("job after cancel: %s", jr.Body)
		}
		st := idemStatus(t, gw.URL, key, nil)
		if st["state"] != "FAILED" || st["cancelled"] != true || st["job_id"] != id {
			t.Errorf("key status after cancel: %v", st)
		}
		again := send(http.MethodDelete, gw.URL+"/v1/jobs/"+id, "", nil)
		if again.Status != http.StatusOK || !bytes.Contains(again.Body, []byte(`"status":"cancelled"`)) {
			t.Errorf("second DELETE: %d %s", again.Status, again.Body)
		}
		// The same key replays the cancellation; nothing runs again.
		dup := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
		expectError(t, dup, http.StatusConflict, "job_cancelled")
		if got := dup.Header.Get("x-should-retry"); got != "false" {
			t.Errorf("replayed cancellation: x-should-retry = %q, want false", got)
		}
		if got := slow.Stats().Requests - before; got != 1 {
			t.Errorf("backend executions = %d, want 1", got)
		}
	})

	t.Run("unknown and malformed ids", func(t *testing.T) {
		ref := send(http.MethodGet, gw.URL+"/v1/jobs/"+jobs.NewID(), "", nil)
		expectError(t, ref, http.StatusNotFound, "")
		for _, id := range []string{"not-a-ulid", "01ARZ3NDEKTSV4RRFFQ69G5FA", "01ARZ3NDEKTSV4RRFFQ69G5FAVX", "01ARZ3NDEKTSV4RRFFQ69G5FAU",
			strings.Repeat("Z", 26), "%2e%2e", "00000000000000000000000000"} {
			for _, suffix := range []string{"", "/events"} {
				r := send(http.MethodGet, gw.URL+"/v1/jobs/"+id+suffix, "", nil)
				if r.Status != http.StatusNotFound || !bytes.Equal(r.Body, ref.Body) {
					t.Errorf("GET /v1/jobs/%s%s: %d %s; want the unknown-id 404 %s", id, suffix, r.Status, r.Body, ref.Body)
				}
			}
			r := send(http.MethodDelete, gw.URL+"/v1/jobs/"+id, "", nil)
			if r.Status != http.StatusNotFound || !bytes.Equal(r.Body, ref.Body) {
				t.Errorf("DELETE /v1/jobs/%s: %d %s", id, r.Status, r.Body)
			}
		}
	})
}

// TestJobsKeylessAfterWindow: two identical keyless background jobs further apart than the
// auto window are two intents: both are executed and each 202's Location leads to its job,
// the first one included after the second reused its record. (Found by this test: the
// second job's id was never indexed, then the first one's became a 404.)
func TestJobsKeylessAfterWindow(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.AutoWindow = config.Duration(time.Millisecond)
	gw := gatewaykit.StartGateway(t, cfg)
	fast := gw.Mock(t, "mock")
	body := chatBody(config.MockModel, "keyless job twice", "")

	var ids []string
	for i := range 2 {
		r := do(t, http.MethodPost, gw.URL+"/v1/jobs", body, nil)
		expect(t, r, http.StatusAccepted, "created")
		id := r.Header.Get("Oncegate-Job-Id")
		ids = append(ids, id)
		testkit.CheckFor(t, 3*time.Second, pollEvery, func() error {
			if j, jr := getJob(t, gw.URL, id); jr.Status != http.StatusOK || j.Status != "completed" {
				return fmt.Errorf("job %d (%s) never completed: %d %s", i, id, jr.Status, jr.Body)
			}
			return nil
		})
	}
	if ids[0] == ids[1] {
		t.Errorf("two intents share job %s", ids[0])
	}
	if got := fast.Stats().Requests; got != 2 {
		t.Errorf("backend executions = %d, want 2", got)
	}
	if j, jr := getJob(t, gw.URL, ids[0]); j.Status != "completed" {
		t.Errorf("the first job after the second ran: %d %s; want it still completed", jr.Status, jr.Body)
	}
}

// eventBlocks is the events of a jobs SSE body as sent, each "id: N\ndata: …\n\n".
func eventBlocks(t testing.TB, body []byte) []string {
	t.Helper()
	evs, err := sseEvents(body)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Raw
	}
	return out
}
