package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
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
	var mu sync.Mutex
	var bodies [][]byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/messages" || r.Header.Get("anthropic-version") == "" {
			http.Error(w, "unexpected request "+r.URL.Path, http.StatusNotFound)
			return
		}
		mu.Lock()
		bodies = append(bodies, body)
		n := len(bodies)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		turn := anthropicToolTurn
		if n > 1 {
			turn = anthropicAnswerTurn
		}
		_, _ = io.WriteString(w, turn)
	}))
	t.Cleanup(up.Close)
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
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 {
		t.Fatalf("the backend got %d requests, want 2", len(bodies))
	}
	checkGolden(t, "responses-anthropic-request-1.golden", append(bodies[0], '\n'))
	checkGolden(t, "responses-anthropic-request-2.golden", append(bodies[1], '\n'))
}
