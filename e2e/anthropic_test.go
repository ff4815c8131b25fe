package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func anthropicClient(gw *gatewaykit.Gateway) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(gw.URL+"/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

func anthropicParams(text string, maxTokens int64) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: "oncegate-mock", MaxTokens: maxTokens,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))}}
}

func messageText(m *anthropic.Message) string {
	out := ""
	for _, b := range m.Content {
		out += b.Text
	}
	return out
}

// TestAnthropicSDK drives POST /v1/messages with the official Anthropic Go SDK: non-stream,
// stream, the same intent as stream and non-stream from one execution, replay by key, and
// Anthropic-format errors raised as the SDK's own *anthropic.Error.
func TestAnthropicSDK(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	client := anthropicClient(gw)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mock := gw.Mock(t, "mock")

	var raw *http.Response
	msg, err := client.Messages.New(ctx, anthropicParams("hello anthropic", 8), option.WithHeader("Idempotency-Key", "anth-1"),
		option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	hdr := raw.Header
	if msg.Role != "assistant" || messageText(msg) == "" || msg.Usage.OutputTokens != 8 || msg.StopReason != "max_tokens" {
		t.Fatalf("message = %+v", msg)
	}
	if hdr.Get("Oncegate-Idempotency") != "created" || hdr.Get("Idempotency-Key") != "anth-1" {
		t.Fatalf("headers: %v", hdr)
	}

	// A streamed copy of the same intent (same key) is served from the same execution.
	stream := client.Messages.NewStreaming(ctx, anthropicParams("hello anthropic", 8), option.WithHeader("Idempotency-Key", "anth-1"))
	var acc anthropic.Message
	events := 0
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
		events++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if messageText(&acc) != messageText(msg) || acc.ID != msg.ID || acc.Usage.OutputTokens != msg.Usage.OutputTokens {
		t.Fatalf("stream copy %q (id %s) differs from %q (id %s)", messageText(&acc), acc.ID, messageText(msg), msg.ID)
	}
	if n := mock.Stats().Requests; n != 1 {
		t.Fatalf("backend executions = %d, want 1", n)
	}

	// A fresh streamed intent: events arrive and accumulate to the mock's answer.
	stream = client.Messages.NewStreaming(ctx, anthropicParams("stream me", 5))
	acc = anthropic.Message{}
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	again, err := client.Messages.New(ctx, anthropicParams("stream me", 5))
	if err != nil {
		t.Fatal(err)
	}
	if messageText(&acc) == "" || messageText(again) != messageText(&acc) {
		t.Fatalf("stream %q vs non-stream copy %q", messageText(&acc), messageText(again))
	}
	if n := mock.Stats().Requests; n != 2 {
		t.Fatalf("backend executions = %d, want 2", n)
	}

	// Errors come back in Anthropic's format, so the SDK raises its usual error.
	cases := []struct {
		name   string
		params anthropic.MessageNewParams
		opts   []option.RequestOption
		status int
	}{
		{"unknown model", anthropic.MessageNewParams{Model: "claude-nope", MaxTokens: 5,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}}, nil, http.StatusNotFound},
		{"malformed key", anthropicParams("x", 5), []option.RequestOption{option.WithHeader("Idempotency-Key", `"open`)}, http.StatusBadRequest},
		{"backend 400 passes through", anthropicParams("x", 5), []option.RequestOption{option.WithJSONSet("mock", map[string]any{"fault": "error_400"})}, http.StatusBadRequest},
		{"key reused with another body", anthropicParams("other body", 5), []option.RequestOption{option.WithHeader("Idempotency-Key", "anth-1")}, http.StatusUnprocessableEntity},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Messages.New(ctx, tc.params, tc.opts...)
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status {
				t.Fatalf("err = %v, want *anthropic.Error %d", err, tc.status)
			}
			var body struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(apiErr.RawJSON()), &body); err != nil || body.Type != "error" || body.Error.Type == "" || body.Error.Message == "" {
				t.Fatalf("not an Anthropic error body: %s", apiErr.RawJSON())
			}
		})
	}
}
