package e2e

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// sdkClient is the official OpenAI Go SDK, unchanged but for its base URL, pointed at gw.
func sdkClient(gw *gatewaykit.Gateway, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(gw.URL + "/v1"),
		option.WithAPIKey("x"),
		option.WithHTTPClient(httpClient),
		option.WithRequestTimeout(30 * time.Second),
	}, opts...)...)
}

func sdkParams(msg string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    "oncegate-mock",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(msg)},
	}
}

// TestSDK drives the gateway with the official OpenAI Go SDK: what it gets back is what the
// mock backend answers directly, byte for byte in content and id.
func TestSDK(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	client := sdkClient(gw)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("non-stream", func(t *testing.T) {
		const msg = "sdk non-stream"
		want := parseCompletion(t, directMock(t, chatBody("oncegate-mock", msg, "")))
		before := mock.Stats().Requests
		var resp *http.Response
		got, err := client.Chat.Completions.New(ctx, sdkParams(msg), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if got.ID != want.ID || got.Model != want.Model || got.Model != "oncegate-mock" {
			t.Errorf("id/model = %q/%q, want %q/%q (the backend's)", got.ID, got.Model, want.ID, want.Model)
		}
		if len(got.Choices) != 1 || got.Choices[0].Message.Content != want.Choices[0].Message.Content {
			t.Fatalf("content = %+v, want %q", got.Choices, want.Choices[0].Message.Content)
		}
		if got.Choices[0].FinishReason != "stop" {
			t.Errorf("finish_reason = %q, want stop", got.Choices[0].FinishReason)
		}
		if got.Usage.CompletionTokens != 16 || got.Usage.TotalTokens != int64(want.Usage.TotalTokens) {
			t.Errorf("usage = %+v, want %+v", got.Usage, *want.Usage)
		}
		if o := resp.Header.Get("Oncegate-Idempotency"); o != "created" {
			t.Errorf("Oncegate-Idempotency = %q, want created", o)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	for _, tc := range []struct {
		name         string
		includeUsage bool
	}{
		{"stream", false},
		{"stream with include_usage", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := "sdk " + tc.name
			want := parseCompletion(t, directMock(t, chatBody("oncegate-mock", msg, "")))
			before := mock.Stats().Requests
			p := sdkParams(msg)
			if tc.includeUsage {
				p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			}
			var resp *http.Response
			stream := client.Chat.Completions.NewStreaming(ctx, p, option.WithResponseInto(&resp))
			acc := openai.ChatCompletionAccumulator{}
			chunks, usageChunks := 0, 0
			for stream.Next() {
				ch := stream.Current()
				chunks++
				if ch.Usage.TotalTokens > 0 {
					usageChunks++
				}
				if !acc.AddChunk(ch) {
					t.Fatalf("accumulator refused chunk %d: %s", chunks, ch.RawJSON())
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if err := stream.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type = %q", ct)
			}
			if chunks < 17 {
				t.Errorf("got %d chunks, want at least 17 (role + 16 tokens)", chunks)
			}
			if acc.ID != want.ID || acc.Model != "oncegate-mock" {
				t.Errorf("id/model = %q/%q, want %q/oncegate-mock", acc.ID, acc.Model, want.ID)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want.Choices[0].Message.Content {
				t.Fatalf("content = %+v, want %q", acc.Choices, want.Choices[0].Message.Content)
			}
			if acc.Choices[0].FinishReason != "stop" {
				t.Errorf("finish_reason = %q, want stop", acc.Choices[0].FinishReason)
			}
			if tc.includeUsage {
				if usageChunks != 1 {
					t.Errorf("%d usage chunks, want 1", usageChunks)
				}
				if acc.Usage.CompletionTokens != 16 || acc.Usage.TotalTokens != int64(want.Usage.TotalTokens) {
					t.Errorf("usage = %+v, want %+v", acc.Usage, *want.Usage)
				}
			} else if usageChunks != 0 || acc.Usage.TotalTokens != 0 {
				t.Errorf("usage sent without stream_options.include_usage: %d chunks, %+v", usageChunks, acc.Usage)
			}
			if n := mock.Stats().Requests - before; n != 1 {
				t.Errorf("backend executions = %d, want 1", n)
			}
		})
	}

	// An unchanged SDK re-sending the same request (its own retry, or app code calling twice)
	// gets the first answer: the auto key holds within the window, so the backend runs once.
	t.Run("identical call is a replay", func(t *testing.T) {
		const msg = "sdk repeated call"
		before := mock.Stats().Requests
		var r1, r2 *http.Response
		a, err := client.Chat.Completions.New(ctx, sdkParams(msg), option.WithResponseInto(&r1))
		if err != nil {
			t.Fatal(err)
		}
		b, err := client.Chat.Completions.New(ctx, sdkParams(msg), option.WithResponseInto(&r2))
		if err != nil {
			t.Fatal(err)
		}
		if a.RawJSON() != b.RawJSON() {
			t.Errorf("second answer differs:\n%s\n%s", a.RawJSON(), b.RawJSON())
		}
		if o := r2.Header.Get("Oncegate-Idempotency"); o != "replayed" {
			t.Errorf("second call: Oncegate-Idempotency = %q, want replayed", o)
		}
		if k1, k2 := r1.Header.Get("Idempotency-Key"), r2.Header.Get("Idempotency-Key"); k1 == "" || k1 != k2 {
			t.Errorf("auto keys %q and %q, want equal and non-empty", k1, k2)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	// A backend 400 is final: the gateway says x-should-retry: false, so the SDK (2 retries by
	// default) does not re-send, and the backend ran once.
	t.Run("backend 400 is not retried", func(t *testing.T) {
		before := mock.Stats().Requests
		_, err := client.Chat.Completions.New(ctx, sdkParams("sdk backend 400"),
			option.WithJSONSet("mock", map[string]any{"fault": "error_400"}))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
			t.Fatalf("err = %v, want *openai.Error with status 400", err)
		}
		if got := apiErr.Response.Header.Get("x-should-retry"); got != "false" {
			t.Errorf("x-should-retry = %q, want false", got)
		}
		if n := mock.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	// The invariant through the SDK: concurrent copies of one keyed intent, streamed and not,
	// on a slow model → one backend execution, every copy the same answer.
	t.Run("concurrent copies of one key", func(t *testing.T) {
		slow := gw.Mock(t, "slowmock")
		const msg = "sdk concurrent copies"
		want := parseCompletion(t, directMock(t, chatBody("oncegate-mock-slow", msg, "")))
		before := slow.Stats().Requests
		const copies = 6
		type result struct {
			id, content, outcome string
			err                  error
		}
		results := make(chan result, copies)
		for i := 0; i < copies; i++ {
			go func(stream bool) {
				p := sdkParams(msg)
				p.Model = "oncegate-mock-slow"
				var resp *http.Response
				opts := []option.RequestOption{option.WithHeader("Idempotency-Key", "sdk-concurrent-1"), option.WithResponseInto(&resp)}
				var r result
				if stream {
					s := client.Chat.Completions.NewStreaming(ctx, p, opts...)
					acc := openai.ChatCompletionAccumulator{}
					for s.Next() {
						acc.AddChunk(s.Current())
					}
					r.err = s.Err()
					_ = s.Close()
					if r.err == nil && len(acc.Choices) == 1 {
						r.id, r.content = acc.ID, acc.Choices[0].Message.Content
					}
				} else {
					c, err := client.Chat.Completions.New(ctx, p, opts...)
					r.err = err
					if err == nil && len(c.Choices) == 1 {
						r.id, r.content = c.ID, c.Choices[0].Message.Content
					}
				}
				if resp != nil {
					r.outcome = resp.Header.Get("Oncegate-Idempotency")
				}
				results <- r
			}(i%2 == 0)
		}
		created := 0
		for i := 0; i < copies; i++ {
			r := <-results
			if r.err != nil {
				t.Errorf("copy: %v", r.err)
				continue
			}
			if r.id != want.ID || r.content != want.Choices[0].Message.Content {
				t.Errorf("copy got %q %q, want %q %q", r.id, r.content, want.ID, want.Choices[0].Message.Content)
			}
			switch r.outcome {
			case "created":
				created++
			case "joined", "replayed":
			default:
				t.Errorf("Oncegate-Idempotency = %q", r.outcome)
			}
		}
		if created != 1 {
			t.Errorf("%d copies created an execution, want 1", created)
		}
		if n := slow.Stats().Requests - before; n != 1 {
			t.Errorf("backend executions = %d, want 1", n)
		}
	})

	t.Run("unknown model is a 404 openai.Error", func(t *testing.T) {
		before := mock.Stats().Requests
		p := sdkParams("sdk unknown model")
		p.Model = "gpt-does-not-exist"
		_, err := client.Chat.Completions.New(ctx, p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("err = %v (%T), want *openai.Error", err, err)
		}
		if apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" || apiErr.Message == "" ||
			apiErr.Type != "invalid_request_error" || apiErr.Param != "model" {
			t.Errorf("error = status %d code %q type %q param %q message %q", apiErr.StatusCode, apiErr.Code, apiErr.Type,
				apiErr.Param, apiErr.Message)
		}
		if n := mock.Stats().Requests - before; n != 0 {
			t.Errorf("backend executions = %d, want 0", n)
		}
	})

	t.Run("unknown model stream is a 404 openai.Error", func(t *testing.T) {
		p := sdkParams("sdk unknown model stream")
		p.Model = "gpt-does-not-exist"
		stream := client.Chat.Completions.NewStreaming(ctx, p)
		for stream.Next() {
			t.Fatalf("got a chunk: %s", stream.Current().RawJSON())
		}
		var apiErr *openai.Error
		if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("err = %v, want *openai.Error with status 404", stream.Err())
		}
		_ = stream.Close()
	})

	t.Run("models list", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, m := range page.Data {
			ids[m.ID] = true
		}
		if !ids["oncegate-mock"] || !ids["oncegate-mock-slow"] {
			t.Errorf("models = %v, want oncegate-mock and oncegate-mock-slow", ids)
		}
	})
}
