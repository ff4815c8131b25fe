package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// anthropicToolTurn is what a Messages backend streams for "weather in Paris?": a text block,
// then a tool_use block whose input arrives in two pieces.
const anthropicToolTurn = `event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type":"ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}

event: message_stop
data: {"type":"message_stop"}

`

// anthropicAnswerTurn answers the tool's result.
const anthropicAnswerTurn = `event: message_start
data: {"type":"message_start","message":{"id":"msg_02","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":80,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"It is 18°C"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" in Paris."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}

event: message_stop
data: {"type":"message_stop"}

`

// idPattern and createdPattern mask what is new every run in goldens: the ids made from a job
// id, and the creation time.
var (
	idPattern      = regexp.MustCompile(`(resp|msg|fc)_[0-9A-HJKMNP-TV-Z]{26}`)
	createdPattern = regexp.MustCompile(`"created_at":[0-9]+`)
)

// TestResponsesOnAnthropic: a Responses request on a route served by an Anthropic Messages
// backend is translated to a Messages request (golden), and the backend's stream, text and a
// tool call, back into Responses events (golden); the tool's output, sent as a continuation
// (previous_response_id plus a function_call_output item), reaches the backend as the
// assistant's tool_use and the user's tool_result (golden), and the answer comes back.
func TestResponsesOnAnthropic(t *testing.T) {
	up := startScripted(t, "/v1/messages", 0, func(n int, r *http.Request) []byte {
		if r.Header.Get("anthropic-version") == "" {
			return nil
		}
		if n > 1 {
			return []byte(anthropicAnswerTurn)
		}
		return []byte(anthropicToolTurn)
	})
	cfg := gatewaykit.Config(t)
	cfg.Backends = append(cfg.Backends, fastRetryBackend("claude", config.TypeAnthropic, up.URL+"/v1", "claude-test"))
	gw := gatewaykit.StartGateway(t, cfg)
	client := sdkClient(gw)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	weather := responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{Name: "get_weather",
		Description: openai.String("Current temperature of a place."),
		Parameters:  map[string]any{"type": "object", "properties": map[string]any{"location": map[string]any{"type": "string"}}, "required": []string{"location"}},
		Strict:      openai.Bool(true)}}
	p := responses.ResponseNewParams{Model: "claude-test", Instructions: openai.String("Be brief."),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather in Paris?")},
		Tools: []responses.ToolUnionParam{weather}, MaxOutputTokens: openai.Int(200)}
	stream := client.Responses.NewStreaming(ctx, p)
	var events bytes.Buffer
	var first responses.Response
	for stream.Next() {
		ev := stream.Current()
		events.WriteString(ev.RawJSON() + "\n")
		if ev.Type == "response.completed" {
			first = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	masked := createdPattern.ReplaceAll(idPattern.ReplaceAll(events.Bytes(), []byte("${1}_ID")), []byte(`"created_at":0`))
	checkGolden(t, "responses-anthropic-events.golden", masked)
	if len(first.Output) != 2 || first.OutputText() != "Let me check." {
		t.Fatalf("output %s", first.RawJSON())
	}
	call := first.Output[1]
	if call.Type != "function_call" || call.CallID != "toolu_01" || call.Name != "get_weather" || call.Arguments.OfString != `{"location":"Paris"}` {
		t.Errorf("function call %s", call.RawJSON())
	}
	if u := first.Usage; u.InputTokens != 30 || u.InputTokensDetails.CachedTokens != 5 || u.OutputTokens != 40 || u.TotalTokens != 70 {
		t.Errorf("usage %s", u.RawJSON())
	}

	output := responses.ResponseInputItemParamOfFunctionCallOutput("18°C")
	output.OfFunctionCallOutput.CallID = openai.String("toolu_01")
	p2 := responses.ResponseNewParams{Model: "claude-test", PreviousResponseID: openai.String(first.ID), Tools: p.Tools,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{output}}}
	second, err := client.Responses.New(ctx, p2)
	if err != nil {
		t.Fatalf("continuation: %v", err)
	}
	if second.OutputText() != "It is 18°C in Paris." || second.Status != responses.ResponseStatusCompleted {
		t.Errorf("continuation %s", second.RawJSON())
	}
	bodies := up.Bodies()
	if len(bodies) != 2 {
		t.Fatalf("the backend got %d requests, want 2", len(bodies))
	}
	checkGolden(t, "responses-anthropic-request-1.golden", append(bodies[0], '\n'))
	checkGolden(t, "responses-anthropic-request-2.golden", append(bodies[1], '\n'))
}

// TestResponsesNative: a backend configured responses: native gets the Responses request as
// the client wrote it (streamed, not in background) and its own events are relayed: the
// copies of one intent get the same bytes from one backend call, under the gateway's response
// id; a retrieve and a resume work from the record; a continuation reaches the backend under
// the backend's own id of the previous response.
func TestResponsesNative(t *testing.T) {
	events, err := os.ReadFile("../internal/responseswire/testdata/docs-text.sse")
	if err != nil {
		t.Fatal(err)
	}
	// The backend's own response id, new per call; events a little apart, so a copy joins live.
	up := startScripted(t, "/v1/responses", 30*time.Millisecond, func(n int, _ *http.Request) []byte {
		return bytes.ReplaceAll(events, []byte("resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654"), []byte(fmt.Sprintf("resp_upstream%d", n)))
	})
	cfg := gatewaykit.Config(t)
	native := fastRetryBackend("native", config.TypeOpenAI, up.URL+"/v1", "gpt-native")
	native.Responses = config.ResponsesNative
	cfg.Backends = append(cfg.Backends, native)
	gw := gatewaykit.StartGateway(t, cfg)

	body := `{"model":"gpt-native","input":"hi","instructions":"You are a helpful assistant.","stream":true,"background":true,"top_k":3}`
	hdr := map[string]string{"Idempotency-Key": "native-1"}
	first := async(func() result { return send(http.MethodPost, gw.URL+"/v1/responses", body, hdr) })
	time.Sleep(100 * time.Millisecond)
	second := send(http.MethodPost, gw.URL+"/v1/responses", body, hdr)
	a := <-first
	expect(t, a, http.StatusOK, "created")
	expect(t, second, http.StatusOK, "joined")
	if !bytes.Equal(a.Body, second.Body) {
		t.Fatalf("the copies differ:\n%s\n----\n%s", a.Body, second.Body)
	}
	got := rawEvents(t, a.Body)
	want := rawEvents(t, events)
	if len(got) != len(want) {
		t.Fatalf("%d events relayed, the backend sent %d", len(got), len(want))
	}
	var created struct {
		SequenceNumber int `json:"sequence_number"`
		Response       struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(got[0]), &created); err != nil || !idPattern.MatchString(created.Response.ID) || created.SequenceNumber != 0 {
		t.Fatalf("first event %s: want the gateway's response id, sequence 0 (%v)", got[0], err)
	}
	if bytes.Contains(a.Body, []byte("resp_upstream")) {
		t.Errorf("the backend's response id reached the client:\n%s", a.Body)
	}
	id := created.Response.ID
	obj := do(t, http.MethodGet, gw.URL+"/v1/responses/"+id, "", nil)
	expectStatus(t, obj, http.StatusOK)
	var resp struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Output []struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if err := json.Unmarshal(obj.Body, &resp); err != nil || resp.ID != id || resp.Status != "completed" ||
		len(resp.Output) != 1 || resp.Output[0].Content[0].Text != "Hi there!" {
		t.Errorf("retrieved %s (%v)", obj.Body, err)
	}
	resumed := do(t, http.MethodGet, gw.URL+"/v1/responses/"+id+"?stream=true&starting_after=3", "", nil)
	if g := rawEvents(t, resumed.Body); strings.Join(g, "\n") != strings.Join(got[4:], "\n") {
		t.Errorf("resumed after 3:\n%s\nwant\n%s", strings.Join(g, "\n"), strings.Join(got[4:], "\n"))
	}

	next := send(http.MethodPost, gw.URL+"/v1/responses", `{"model":"gpt-native","input":"and then?","previous_response_id":"`+id+`"}`, nil)
	expectStatus(t, next, http.StatusOK)
	bodies := up.Bodies()
	if len(bodies) != 2 {
		t.Fatalf("the backend got %d requests, want 2 (one per intent)", len(bodies))
	}
	var sent []map[string]any
	for _, b := range bodies {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, m)
	}
	if sent[0]["stream"] != true || sent[0]["background"] != nil || sent[0]["top_k"] != 3.0 || sent[0]["input"] != "hi" {
		t.Errorf("first request sent %s: want the client's, streamed, not in background", bodies[0])
	}
	if sent[1]["previous_response_id"] != "resp_upstream1" {
		t.Errorf("continuation sent %s: want previous_response_id the backend's own id resp_upstream1", bodies[1])
	}
}

// scripted is a backend on 127.0.0.1 that answers POSTs to one path with scripted SSE events
// and keeps the bodies it got.
type scripted struct {
	*httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

// startScripted serves path: stream returns the n-th call's events (nil: refuse it with 404),
// written gap apart (0: at once).
func startScripted(t testing.TB, path string, gap time.Duration, stream func(n int, r *http.Request) []byte) *scripted {
	t.Helper()
	s := &scripted{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, body)
		n := len(s.bodies)
		s.mu.Unlock()
		events := stream(n, r)
		if r.URL.Path != path || events == nil {
			http.Error(w, "unexpected request "+r.URL.Path, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range bytes.SplitAfter(events, []byte("\n\n")) {
			_, _ = w.Write(ev)
			w.(http.Flusher).Flush()
			time.Sleep(gap)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// Bodies are the request bodies received so far.
func (s *scripted) Bodies() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.bodies)
}
