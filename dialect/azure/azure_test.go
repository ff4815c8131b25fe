package azure

import (
	"encoding/json"
	"testing"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/internal/config"
)

// TestPrepare: the request goes to the model's deployment with the api-version, the key in
// api-key, the body as the openai dialect prepares it.
func TestPrepare(t *testing.T) {
	tests := []struct {
		name    string
		backend config.Backend
		model   string
		stream  bool
		path    string
	}{
		{"deployment named after the model, default version", config.Backend{}, "gpt-4o", false,
			"/openai/deployments/gpt-4o/chat/completions?api-version=" + config.DefaultAzureAPIVersion},
		{"mapped deployment", config.Backend{Deployments: map[string]string{"gpt-4o": "prod-4o"}, APIVersion: "2024-10-21"}, "gpt-4o", true,
			"/openai/deployments/prod-4o/chat/completions?api-version=2024-10-21"},
		{"unmapped model beside a map", config.Backend{Deployments: map[string]string{"gpt-4o": "prod-4o"}}, "gpt-4o-mini", false,
			"/openai/deployments/gpt-4o-mini/chat/completions?api-version=" + config.DefaultAzureAPIVersion},
		{"preview version", config.Backend{APIVersion: "2025-04-01-preview"}, "o3", true,
			"/openai/deployments/o3/chat/completions?api-version=2025-04-01-preview"},
		{"a model name that is no path segment is escaped", config.Backend{}, "org/model x?", false,
			"/openai/deployments/org%2Fmodel%20x%3F/chat/completions?api-version=" + config.DefaultAzureAPIVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"` + tt.model + `","messages":[{"role":"user","content":"hi"}]}`
			up, err := New().Prepare(dialect.Request{API: dialect.APIOpenAI, Model: tt.model, Body: []byte(body), Stream: tt.stream}, tt.backend)
			if err != nil {
				t.Fatal(err)
			}
			if up.Path != tt.path {
				t.Errorf("path %s\nwant %s", up.Path, tt.path)
			}
			if up.KeyHeader != "api-key" {
				t.Errorf("key header %q, want api-key", up.KeyHeader)
			}
			var sent struct {
				Stream        bool            `json:"stream"`
				StreamOptions json.RawMessage `json:"stream_options"`
			}
			if err := json.Unmarshal(up.Body, &sent); err != nil {
				t.Fatalf("body %s: %v", up.Body, err)
			}
			if sent.Stream != tt.stream || (tt.stream && string(sent.StreamOptions) != `{"include_usage":true}`) || (!tt.stream && sent.StreamOptions != nil) {
				t.Errorf("body %s: want stream %v and stream_options.include_usage only on a stream", up.Body, tt.stream)
			}
		})
	}
}

func TestErrorBody(t *testing.T) {
	tests := []struct {
		name   string
		status int
		in     string
		want   string
	}{
		{"content filter", 400,
			`{"error":{"message":"The response was filtered","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":true,"severity":"medium"}}}}}`,
			`{"error":{"message":"The response was filtered","type":"invalid_request_error","param":"prompt","code":"content_filter","innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":true,"severity":"medium"}}}}}`},
		{"bad key", 401, `{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint."}}`,
			`{"error":{"message":"Access denied due to invalid subscription key or wrong API endpoint.","type":"authentication_error","param":null,"code":"401"}}`},
		{"no deployment", 404, `{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist."}}`,
			`{"error":{"message":"The API deployment for this resource does not exist.","type":"invalid_request_error","param":null,"code":"DeploymentNotFound"}}`},
		{"numeric code", 429, `{"error":{"code":429,"message":"Rate limit is exceeded."}}`,
			`{"error":{"message":"Rate limit is exceeded.","type":"rate_limit_error","param":null,"code":"429"}}`},
		{"an OpenAI error passed on", 400, `{"error":{"message":"Unrecognized request argument supplied: foo","type":"invalid_request_error","param":null,"code":null}}`,
			`{"error":{"message":"Unrecognized request argument supplied: foo","type":"invalid_request_error","param":null,"code":null}}`},
		{"API gateway shape", 401, `{"statusCode":401,"message":"Unauthorized. Access token is missing."}`,
			`{"error":{"message":"Unauthorized. Access token is missing.","type":"authentication_error","param":null,"code":"401"}}`},
		{"not JSON", 502, `<html>Bad Gateway</html>`,
			`{"error":{"message":"the azure backend failed with status 502","type":"server_error","param":null,"code":null}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(New().ErrorBody(tt.status, []byte(tt.in))); got != tt.want {
				t.Errorf("ErrorBody =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestStream: Azure's prompt-filter chunk is held as an opening event and never relayed, nor
// counted as output; the role, content and usage chunks are the openai dialect's; a broken
// stream is never continued, whatever the backend's continuation says.
func TestStream(t *testing.T) {
	s := New().NewStream(dialect.StreamOptions{Track: true, Model: "gpt-4o"})
	filter := dialect.Event{Data: []byte(`{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}`)}
	if !s.Opening(filter) {
		t.Error("the prompt-filter chunk is not an opening event")
	}
	if out := s.Decode(filter, nil); out.Frame != nil || out.Usage != nil || out.Token || out.Err != nil {
		t.Errorf("the prompt-filter chunk became %+v, want nothing", out)
	}
	role := dialect.Event{Data: []byte(`{"choices":[{"content_filter_results":{},"delta":{"content":"","refusal":null,"role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":1,"id":"chatcmpl-1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk"}`)}
	if !s.Opening(role) {
		t.Error("the role chunk is not an opening event")
	}
	content := dialect.Event{Data: []byte(`{"choices":[{"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}},"delta":{"content":"Hi"},"finish_reason":null,"index":0,"logprobs":null}],"created":1,"id":"chatcmpl-1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk"}`)}
	if s.Opening(content) {
		t.Error("a content chunk is an opening event")
	}
	if out := s.Decode(content, nil); string(out.Frame) != "data: "+string(content.Data)+"\n\n" || !out.Token {
		t.Errorf("content chunk became %q (token %v), want it relayed as it is", out.Frame, out.Token)
	}
	usage := dialect.Event{Data: []byte(`{"choices":[],"created":1,"id":"chatcmpl-1","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","usage":{"completion_tokens":1,"prompt_tokens":9,"total_tokens":10}}`)}
	if s.Opening(usage) {
		t.Error("the usage chunk is an opening event")
	}
	if out := s.Decode(usage, nil); out.Usage == nil || out.Frame != nil {
		t.Errorf("usage chunk became %+v, want a usage frame", out)
	}
	if u := s.Usage(); u == nil || *u != (dialect.Usage{PromptTokens: 9, CompletionTokens: 1, TotalTokens: 10}) {
		t.Errorf("Usage() = %+v", u)
	}
	for _, b := range []config.Backend{{Type: config.TypeAzure}, {Type: config.TypeAzure, Continuation: config.ContinuationVLLM}} {
		if s.CanContinue(b) {
			t.Errorf("CanContinue(%+v) after output = true", b)
		}
	}
	if _, err := s.Continuation([]byte(`{}`)); err == nil {
		t.Error("Continuation returned no error")
	}
}

// FuzzErrorBody: any backend body becomes an OpenAI error object with a message.
func FuzzErrorBody(f *testing.F) {
	f.Add(400, []byte(`{"error":{"code":"content_filter","message":"m","param":"prompt","innererror":{"code":"x"}}}`))
	f.Add(401, []byte(`{"statusCode":401,"message":"m"}`))
	f.Add(429, []byte(`{"error":{"code":429,"message":"m"}}`))
	f.Fuzz(func(t *testing.T, status int, in []byte) {
		out := New().ErrorBody(status, in)
		var e struct {
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal(out, &e); err != nil || e.Error == nil || e.Error.Type == "" || e.Error.Message == "" {
			t.Fatalf("ErrorBody(%d, %q) = %s (%v)", status, in, out, err)
		}
	})
}
