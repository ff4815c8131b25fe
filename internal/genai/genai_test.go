package genai_test

import (
	"slices"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/genai"
)

// TestProvider: every configured backend type has the conventions' provider name (a custom
// one for oncegate and the mock).
func TestProvider(t *testing.T) {
	for typ, want := range map[string]string{
		config.TypeOpenAI: "openai", config.TypeAnthropic: "anthropic", config.TypeGemini: "gcp.gemini",
		config.TypeAzure: "azure.ai.openai", "bedrock": "aws.bedrock", config.TypeOncegate: "oncegate", config.TypeMock: "oncegate.mock",
	} {
		if got := genai.Provider(typ); got != want {
			t.Errorf("Provider(%q) = %q, want %q", typ, got, want)
		}
	}
}

// TestReadResponse reads the model, id, finish reasons and text of each client API's answer
// and stream.
func TestReadResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
		out    string
		want   genai.Response
	}{
		{"chat completion", false, `{"id":"c1","model":"m-1","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`,
			genai.Response{ID: "c1", Model: "m-1", FinishReasons: []string{"stop"}, Text: "hi"}},
		{"chat stream", true, "data: {\"id\":\"c2\",\"model\":\"m-2\",\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n" +
			"data: {\"id\":\"c2\",\"model\":\"m-2\",\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}]}\n\n",
			genai.Response{ID: "c2", Model: "m-2", FinishReasons: []string{"length"}, Text: "ab"}},
		{"anthropic message", false, `{"id":"msg_1","type":"message","model":"claude-x","content":[{"type":"text","text":"yo"}],"stop_reason":"end_turn"}`,
			genai.Response{ID: "msg_1", Model: "claude-x", FinishReasons: []string{"end_turn"}, Text: "yo"}},
		{"anthropic stream", true, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"model\":\"claude-y\",\"content\":[],\"stop_reason\":null}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"z\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n",
			genai.Response{ID: "msg_2", Model: "claude-y", FinishReasons: []string{"max_tokens"}, Text: "z"}},
		{"responses", false, `{"id":"resp_1","object":"response","model":"gpt-r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"content":[{"type":"output_text","text":"q"}]}]}`,
			genai.Response{ID: "resp_1", Model: "gpt-r", FinishReasons: []string{"max_output_tokens"}, Text: "q"}},
		{"responses stream", true, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\",\"model\":\"gpt-s\",\"status\":\"in_progress\"}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"w\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_2\",\"model\":\"gpt-s\",\"status\":\"completed\",\"output\":[{\"content\":[{\"type\":\"output_text\",\"text\":\"w\"}]}]}}\n\n",
			genai.Response{ID: "resp_2", Model: "gpt-s", FinishReasons: []string{"completed"}, Text: "w"}},
		{"not JSON", false, `<html>`, genai.Response{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := genai.ReadResponse(tc.stream, []byte(tc.out), true)
			if got.ID != tc.want.ID || got.Model != tc.want.Model || !slices.Equal(got.FinishReasons, tc.want.FinishReasons) || got.Text != tc.want.Text {
				t.Fatalf("ReadResponse = %+v, want %+v", got, tc.want)
			}
			if noText := genai.ReadResponse(tc.stream, []byte(tc.out), false); noText.Text != "" {
				t.Fatalf("text read without content capture: %q", noText.Text)
			}
		})
	}
}

// TestInput: the request's messages and system instructions in the conventions' format.
func TestInput(t *testing.T) {
	msgs, system := genai.Input([]byte(`{"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{}}]},{"role":"assistant","content":"b"}]}`))
	if want := `[{"role":"user","parts":[{"type":"text","content":"a"}]},{"role":"assistant","parts":[{"type":"text","content":"b"}]}]`; msgs != want {
		t.Errorf("messages %s, want %s", msgs, want)
	}
	if want := `[{"type":"text","content":"be brief"}]`; system != want {
		t.Errorf("system %s, want %s", system, want)
	}
}
