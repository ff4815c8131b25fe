package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// responsesParams is a Responses request for the mock; knobs (a JSON object) go to the mock
// as the SDK's extra body would send them.
func responsesParams(input string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: config.MockModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)},
	}
}

func withKnobs(knobs string) option.RequestOption {
	return option.WithJSONSet("mock", json.RawMessage(knobs))
}

// rawEvents reads a Responses SSE body into its events' data, in order.
func rawEvents(t testing.TB, body []byte) []string {
	t.Helper()
	evs, err := sseEvents(body)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Data)
	}
	return out
}

// TestResponses drives POST /v1/responses with the official OpenAI Go SDK: what the mock
// generates comes back as a Responses object and event stream, once per intent.
func TestResponses(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	client := sdkClient(gw)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("non-stream", func(t *testing.T) {
		const msg = "responses non-stream"
		want := mockContent(t, msg)
		before := mock.Stats().Requests
		got, err := client.Responses.New(ctx, responsesParams(msg))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if got.OutputText() != want {
			t.Errorf("output text = %q, want the mock's %q", got.OutputText(), want)
		}
		if got.Status != responses.ResponseStatusCompleted || !strings.HasPrefix(got.ID, "resp_") || got.Model != config.MockModel {
			t.Errorf("status/id/model = %q/%q/%q", got.Status, got.ID, got.Model)
		}
		if got.Usage.OutputTokens != 16 || got.Usage.TotalTokens != got.Usage.InputTokens+16 {
			t.Errorf("usage = %+v, want 16 output tokens", got.Usage)
		}
		// The same request again (no key: the auto key of its content) is a replay.
		var resp *http.Response
		again, err := client.Responses.New(ctx, responsesParams(msg), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("New again: %v", err)
		}
		if again.ID != got.ID || again.RawJSON() != got.RawJSON() {
			t.Errorf("the copy got another response:\n%s\nwant\n%s", again.RawJSON(), got.RawJSON())
		}
		if o := resp.Header.Get("Oncegate-Idempotency"); o != "replayed" {
			t.Errorf("copy outcome = %q, want replayed", o)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
		// Retrieved by id: the same object.
		ret, err := client.Responses.Get(ctx, got.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if ret.RawJSON() != got.RawJSON() {
			t.Errorf("retrieved:\n%s\nwant\n%s", ret.RawJSON(), got.RawJSON())
		}
	})

	t.Run("stream", func(t *testing.T) {
		const msg = "responses stream"
		want := mockContent(t, msg)
		stream := client.Responses.NewStreaming(ctx, responsesParams(msg))
		var text strings.Builder
		var types []string
		var final responses.Response
		seq := int64(-1)
		for stream.Next() {
			ev := stream.Current()
			types = append(types, ev.Type)
			if ev.SequenceNumber != seq+1 {
				t.Errorf("sequence_number %d after %d", ev.SequenceNumber, seq)
			}
			seq = ev.SequenceNumber
			switch ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.Delta)
			case "response.completed":
				final = ev.Response
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if text.String() != want || final.OutputText() != want {
			t.Errorf("streamed text %q, final %q, want %q", text.String(), final.OutputText(), want)
		}
		wantTypes := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
		if len(types) < 8 || strings.Join(types[:4], ",") != strings.Join(wantTypes, ",") ||
			types[len(types)-1] != "response.completed" {
			t.Errorf("event types = %v", types)
		}
		if final.Usage.OutputTokens != 16 {
			t.Errorf("final usage = %+v", final.Usage)
		}
	})

	t.Run("stream copies byte-identical and resumable", func(t *testing.T) {
		body := `{"model":"` + config.MockModel + `","input":"responses copies","stream":true,"mock":{"inter_token_ms":40}}`
		before := mock.Stats().Requests
		hdr := map[string]string{"Idempotency-Key": "resp-copies-1"}
		first := async(func() result { return send(http.MethodPost, gw.URL+"/v1/responses", body, hdr) })
		time.Sleep(150 * time.Millisecond)
		second := send(http.MethodPost, gw.URL+"/v1/responses", body, hdr)
		a := <-first
		expect(t, a, http.StatusOK, "created")
		expect(t, second, http.StatusOK, "joined")
		if !bytes.Equal(a.Body, second.Body) {
			t.Fatalf("the two copies' streams differ:\n%s\n----\n%s", a.Body, second.Body)
		}
		events := rawEvents(t, a.Body)
		var created struct {
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(events[0]), &created); err != nil || created.Response.ID == "" {
			t.Fatalf("first event %s: %v", events[0], err)
		}
		// Resumed after event 5 (from the record now): exactly the events after it.
		r := do(t, http.MethodGet, gw.URL+"/v1/responses/"+created.Response.ID+"?stream=true&starting_after=5", "", nil)
		expectStatus(t, r, http.StatusOK)
		if got := rawEvents(t, r.Body); strings.Join(got, "\n") != strings.Join(events[6:], "\n") {
			t.Errorf("resumed after 5:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(events[6:], "\n"))
		}
		// A replay of the stream is byte-identical too.
		third := send(http.MethodPost, gw.URL+"/v1/responses", body, hdr)
		expect(t, third, http.StatusOK, "replayed")
		if !bytes.Equal(third.Body, a.Body) {
			t.Errorf("the replay differs:\n%s\n----\n%s", third.Body, a.Body)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	t.Run("background, retrieve, resume live with the SDK", func(t *testing.T) {
		before := mock.Stats().Requests
		p := responsesParams("responses background")
		p.Background = openai.Bool(true)
		got, err := client.Responses.New(ctx, p, withKnobs(`{"inter_token_ms":60}`))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if got.Status != responses.ResponseStatusQueued && got.Status != responses.ResponseStatusInProgress {
			t.Fatalf("background status = %q, want queued or in_progress", got.Status)
		}
		// Follow the live stream, cut it after a few events, resume after the last one seen.
		stream := client.Responses.GetStreaming(ctx, got.ID, responses.ResponseGetParams{})
		var seen []string
		last := int64(-1)
		for stream.Next() {
			ev := stream.Current()
			seen = append(seen, ev.RawJSON())
			last = ev.SequenceNumber
			if len(seen) == 6 {
				break
			}
		}
		stream.Close()
		if last != 5 {
			t.Fatalf("first part ended at sequence %d (err %v)", last, stream.Err())
		}
		rest := client.Responses.GetStreaming(ctx, got.ID, responses.ResponseGetParams{StartingAfter: openai.Int(last)})
		var final responses.Response
		for rest.Next() {
			ev := rest.Current()
			if ev.SequenceNumber != last+1 {
				t.Errorf("resumed event %d after %d", ev.SequenceNumber, last)
			}
			last = ev.SequenceNumber
			seen = append(seen, ev.RawJSON())
			if ev.Type == "response.completed" {
				final = ev.Response
			}
		}
		if err := rest.Err(); err != nil {
			t.Fatalf("resumed stream: %v", err)
		}
		want := mockContent(t, "responses background")
		if final.OutputText() != want {
			t.Errorf("final text %q, want %q", final.OutputText(), want)
		}
		// The whole stream, from the record, equals what the two parts gave.
		whole := do(t, http.MethodGet, gw.URL+"/v1/responses/"+got.ID+"?stream=true", "", nil)
		if g, w := strings.Join(rawEvents(t, whole.Body), "\n"), strings.Join(seen, "\n"); g != w {
			t.Errorf("cut and resumed:\n%s\nwant the uninterrupted\n%s", w, g)
		}
		ret, err := client.Responses.Get(ctx, got.ID, responses.ResponseGetParams{})
		if err != nil || ret.Status != responses.ResponseStatusCompleted || ret.OutputText() != want {
			t.Errorf("retrieved %v %q: %v", ret.Status, ret.OutputText(), err)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		p := responsesParams("responses cancel")
		p.Background = openai.Bool(true)
		got, err := client.Responses.New(ctx, p, withKnobs(`{"inter_token_ms":200}`))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c, err := client.Responses.Cancel(ctx, got.ID)
		if err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		if c.Status != responses.ResponseStatusCancelled {
			t.Errorf("cancel answered status %q", c.Status)
		}
		ret, err := client.Responses.Get(ctx, got.ID, responses.ResponseGetParams{})
		if err != nil || ret.Status != responses.ResponseStatusCancelled {
			t.Errorf("retrieved after cancel: %v %v", ret.Status, err)
		}
	})

	t.Run("previous_response_id", func(t *testing.T) {
		first, err := client.Responses.New(ctx, responsesParams("responses turn one"))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		before := mock.Stats().Requests
		p := responsesParams("responses turn two")
		p.PreviousResponseID = openai.String(first.ID)
		second, err := client.Responses.New(ctx, p)
		if err != nil {
			t.Fatalf("continued: %v", err)
		}
		// The mock's answer depends on the whole conversation: the continuation's is what the
		// mock gives the three chat messages directly.
		conv := `{"model":"` + config.MockModel + `","messages":[{"role":"user","content":"responses turn one"},` +
			`{"role":"assistant","content":` + strconv.Quote(first.OutputText()) + `},{"role":"user","content":"responses turn two"}]}`
		_, want := reference(t, conv)
		if second.OutputText() != want {
			t.Errorf("continued answer %q, want the mock's for the whole conversation %q", second.OutputText(), want)
		}
		if second.PreviousResponseID != first.ID {
			t.Errorf("previous_response_id = %q", second.PreviousResponseID)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
		// A response sent with store: false is not kept to be continued.
		unstored := responsesParams("responses not stored")
		unstored.Store = openai.Bool(false)
		gone, err := client.Responses.New(ctx, unstored)
		if err != nil {
			t.Fatalf("store false: %v", err)
		}
		p.PreviousResponseID = openai.String(gone.ID)
		_, err = client.Responses.New(ctx, p)
		var notStored *openai.Error
		if !errors.As(err, &notStored) || notStored.StatusCode != http.StatusBadRequest || notStored.Code != "previous_response_not_found" {
			t.Errorf("continuing a store: false response: %v", err)
		}
		p.PreviousResponseID = openai.String("resp_01JZZZZZZZZZZZZZZZZZZZZZZZ")
		_, err = client.Responses.New(ctx, p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "previous_response_not_found" {
			t.Errorf("unknown previous_response_id: %v", err)
		}
	})

	t.Run("bad input changes nothing", func(t *testing.T) {
		before := mock.Stats().Requests
		for _, tc := range []struct{ name, body, code string }{
			{"no model", `{"input":"x"}`, "missing_required_parameter"},
			{"no input", `{"model":"` + config.MockModel + `"}`, "missing_required_parameter"},
			{"chat body", `{"model":"` + config.MockModel + `","messages":[{"role":"user","content":"x"}]}`, "unsupported_parameter"},
			{"web search", `{"model":"` + config.MockModel + `","input":"x","tools":[{"type":"web_search"}]}`, "unsupported_parameter"},
			{"bad role", `{"model":"` + config.MockModel + `","input":[{"role":"robot","content":"x"}]}`, "invalid_value"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := send(http.MethodPost, gw.URL+"/v1/responses", tc.body, nil)
				expectError(t, r, http.StatusBadRequest, tc.code)
			})
		}
		// An encoded body is decoded within the body limit here too (4 MiB by default).
		bomb := gzipped(`{"model":"` + config.MockModel + `","input":"` + strings.Repeat("x", 5<<20) + `"}`)
		r := send(http.MethodPost, gw.URL+"/v1/responses", bomb, map[string]string{"Content-Type": "application/json", "Content-Encoding": "gzip"})
		expectError(t, r, http.StatusRequestEntityTooLarge, "request_too_large")
		r = send(http.MethodPost, gw.URL+"/v1/responses", `{"model":"`+config.MockModel+`","input":"x"}`,
			map[string]string{"Content-Type": "application/json", "Content-Encoding": "br"})
		expectError(t, r, http.StatusUnsupportedMediaType, "unsupported_content_encoding")
		r = do(t, http.MethodGet, gw.URL+"/v1/responses/resp_nope", "", nil)
		expectError(t, r, http.StatusNotFound, "not_found")
		if n := mock.Stats().Requests - before; n != 0 {
			t.Errorf("backend executions = %d, want 0", n)
		}
	})
}

// TestResponsesSDKTimeout: the official Go SDK, unchanged (no key, its default retries), with
// a 1 s HTTP timeout against a 1.8 s generation on /v1/responses. The first attempt times
// out; its retry (x-stainless-retry-count 1, the same body, so the same auto key) joins the
// running execution and gets its answer: one backend execution, answered.
func TestResponsesSDKTimeout(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	slow := gw.Mock(t, "slowmock")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	var seen sdkAttempts
	client := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey("sk-unused"),
		option.WithHTTPClient(hc), option.WithMiddleware(seen.middleware))
	p := responses.ResponseNewParams{Model: slowModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("responses sdk timeout")}}
	before := slow.Stats().Requests
	start := time.Now()
	// 16 tokens, the first at once and then 120 ms apart: 1.8 s.
	got, err := client.Responses.New(ctx, p, withKnobs(`{"ttft_ms":0,"inter_token_ms":120}`))
	took := time.Since(start)
	attempts := seen.snapshot()
	if err != nil {
		t.Fatalf("SDK call failed after %d attempts: %v", len(attempts), err)
	}
	if len(attempts) < 2 {
		t.Errorf("%d attempt(s) in %v; the test needs the first to time out", len(attempts), took)
	}
	_, want := reference(t, chatBody(slowModel, "responses sdk timeout", ""))
	if got.OutputText() != want || got.Status != responses.ResponseStatusCompleted {
		t.Errorf("answer %q (%s), want %q", got.OutputText(), got.Status, want)
	}
	if n := slow.Stats().Requests - before; n != 1 {
		t.Errorf("backend executions = %d after %d SDK attempts, want 1", n, len(attempts))
	}
	t.Logf("answered after %d attempts in %v", len(attempts), took)
}

// TestResponsesResumeOnAnotherNode: a stream started on API node A, cut by the client at a
// random event, resumed with starting_after on API node B (its own process state, the same
// NATS): the events of the two parts are exactly those of an uninterrupted run, and the
// backend executed once.
func TestResponsesResumeOnAnotherNode(t *testing.T) {
	acfg := gatewaykit.Config(t)
	acfg.NATS.Listen = "127.0.0.1:0"
	a := gatewaykit.StartGateway(t, acfg)
	bcfg := gatewaykit.Config(t)
	bcfg.Role = "api"
	bcfg.NATS.URL = a.NATSURL()
	b := gatewaykit.StartGateway(t, bcfg)
	mock := a.Mock(t, "mock")
	clientA, clientB := sdkClient(a), sdkClient(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for trial := range 3 {
		// 16 tokens make 24 events (created, in_progress, item and part added, 16 deltas, text
		// done, part done, item done, completed): cut after any of events 1 to 22.
		cut := 1 + rng.IntN(22)
		t.Run(fmt.Sprintf("cut after event %d", cut), func(t *testing.T) {
			before := mock.Stats().Requests
			input := fmt.Sprintf("responses resume %d %d", seed, trial)
			p := responsesParams(input)
			stream := clientA.Responses.NewStreaming(ctx, p, withKnobs(`{"inter_token_ms":30}`))
			var seen []string
			last := int64(-1)
			var id string
			for stream.Next() {
				ev := stream.Current()
				if ev.Type == "response.created" {
					id = ev.Response.ID
				}
				seen, last = append(seen, ev.RawJSON()), ev.SequenceNumber
				if last == int64(cut) {
					break
				}
			}
			stream.Close() // the client goes away mid-stream
			if last != int64(cut) || id == "" {
				t.Fatalf("the first part ended at %d (id %q): %v", last, id, stream.Err())
			}
			rest := clientB.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{StartingAfter: openai.Int(last)})
			for rest.Next() {
				ev := rest.Current()
				if ev.SequenceNumber != last+1 {
					t.Errorf("event %d after %d: a gap or a repeat", ev.SequenceNumber, last)
				}
				seen, last = append(seen, ev.RawJSON()), ev.SequenceNumber
			}
			if err := rest.Err(); err != nil {
				t.Fatalf("resumed on B: %v", err)
			}
			whole := do(t, http.MethodGet, b.URL+"/v1/responses/"+id+"?stream=true", "", nil)
			expectStatus(t, whole, http.StatusOK)
			if got, want := strings.Join(seen, "\n"), strings.Join(rawEvents(t, whole.Body), "\n"); got != want {
				t.Errorf("cut and resumed:\n%s\nwant the uninterrupted run\n%s", got, want)
			}
			if len(seen) != 24 {
				t.Errorf("%d events, want 24", len(seen))
			}
			if n := mock.Stats().Requests - before; n != 1 {
				t.Errorf("backend executions = %d, want 1", n)
			}
		})
	}
	t.Logf("seed %d", seed)
}
