package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// sdkAttempt is one HTTP attempt the SDK made, seen by a middleware.
type sdkAttempt struct {
	retryCount string
	body       []byte
}

// sdkAttempts records the SDK's attempts.
type sdkAttempts struct {
	mu   sync.Mutex
	list []sdkAttempt
}

func (a *sdkAttempts) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	var body []byte
	if req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			body, _ = io.ReadAll(rc)
			rc.Close()
		}
	}
	a.mu.Lock()
	a.list = append(a.list, sdkAttempt{retryCount: req.Header.Get("X-Stainless-Retry-Count"), body: body})
	a.mu.Unlock()
	return next(req)
}

func (a *sdkAttempts) snapshot() []sdkAttempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]sdkAttempt(nil), a.list...)
}

// TestSDKRetriesWithoutKey: the official OpenAI Go SDK, unchanged (its default 2 retries, no
// Idempotency-Key), with a 300 ms timeout, far shorter than the generation (16 tokens 60 or
// 200 ms apart on the slow mock). Every attempt times out; the backend executes exactly once.
//
// Why: with no key, the gateway derives one from the tenant, the route and the canonical body.
// An identical request matches an earlier one only inside the auto window, here 1 ms so that
// the window explains nothing; but each SDK retry carries x-stainless-retry-count >= 1, and a
// request that declares itself a retry matches the most recent identical request for the
// whole TTL. So every retry joins the running execution instead of starting another. A later
// call of the application that declares itself a retry (the configured retry header
// X-App-Retry) is answered from the stored result ("replayed"); the same call without it would,
// by design, be a new intent (TestAutoKey shows both sides).
//
// How the SDK (v3.98.0) retries depends on which timeout fires: an http.Client timeout is a
// transport error, which it retries; its own option.WithRequestTimeout deadline is returned at
// once without a retry (internal/requestconfig/requestconfig.go, "if ctx.Err() != nil { return
// ctx.Err() }"). Both are exercised; the exactly-once result must not depend on it.
func TestSDKRetriesWithoutKey(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.AutoWindow = config.Duration(time.Millisecond)
	cfg.Idempotency.RetryHeaders = []string{"X-App-Retry"}
	gw := gatewaykit.StartGateway(t, cfg)
	slow := gw.Mock(t, "slowmock")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, tc := range []struct {
		name        string
		httpTimeout time.Duration // http.Client.Timeout of the SDK's client
		opts        []option.RequestOption
		interToken  int // ms between the mock's 16 tokens
		minAttempts int
	}{
		// Three attempts of 300 ms with the SDK's backoff (≤0.5 s, ≤1 s) end by 2.4 s; the answer
		// takes 16 × 200 ms = 3.2 s.
		{name: "http client timeout", httpTimeout: 300 * time.Millisecond, interToken: 200, minAttempts: 3},
		{name: "SDK request timeout", opts: []option.RequestOption{option.WithRequestTimeout(300 * time.Millisecond)}, interToken: 60, minAttempts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := &http.Client{Timeout: tc.httpTimeout, Transport: &http.Transport{}}
			defer hc.CloseIdleConnections()
			var seen sdkAttempts
			client := openai.NewClient(option.WithBaseURL(gw.URL+"/v1"), option.WithAPIKey("sk-unused"),
				option.WithHTTPClient(hc), option.WithMiddleware(seen.middleware))
			params := openai.ChatCompletionNewParams{
				Model:    slowModel,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("sdk retries: " + tc.name)},
			}
			knobs := option.WithJSONSet("mock", map[string]any{"inter_token_ms": tc.interToken})
			before := slow.Stats().Requests

			_, err := client.Chat.Completions.New(ctx, params, append([]option.RequestOption{knobs}, tc.opts...)...)
			if err == nil {
				t.Fatal("the SDK call succeeded; the test needs every attempt to time out")
			}
			attempts := seen.snapshot()
			t.Logf("SDK error after %d attempt(s): %v", len(attempts), err)
			if tc.httpTimeout == 0 && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("SDK error %v, want its request deadline", err)
			}
			if len(attempts) < tc.minAttempts {
				t.Errorf("%d attempts, want at least %d", len(attempts), tc.minAttempts)
			}
			for i, a := range attempts {
				if a.retryCount != strconv.Itoa(i) {
					t.Errorf("attempt %d: X-Stainless-Retry-Count %q, want %d", i, a.retryCount, i)
				}
				if !bytes.Equal(a.body, attempts[0].body) {
					t.Errorf("attempt %d sent another body", i)
				}
			}
			body := attempts[0].body
			_, wantContent := reference(t, string(body))

			// The execution the first attempt started completes with nobody waiting.
			key, err := autoKey("anonymous", chatPath, body)
			if err != nil {
				t.Fatal(err)
			}
			testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
				r := send(http.MethodGet, gw.URL+"/v1/idempotency/"+url.PathEscape(key), "", nil)
				if r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(`"state":"COMPLETED"`)) {
					return fmt.Errorf("the key's execution has not completed: %d %v %s", r.Status, r.Err, r.Body)
				}
				return nil
			})
			if got := slow.Stats().Requests - before; got != 1 {
				t.Fatalf("backend executions = %d after %d SDK attempts, want 1", got, len(attempts))
			}

			// The application calls again, long timeout, same parameters, declaring a retry.
			var resp *http.Response
			got, err := client.Chat.Completions.New(ctx, params, knobs, option.WithRequestTimeout(30*time.Second),
				option.WithHTTPClient(httpClient), option.WithHeader("X-App-Retry", "1"), option.WithResponseInto(&resp))
			if err != nil {
				t.Fatalf("final call: %v", err)
			}
			// Replayed from the record, or joined: the API node may still follow the execution
			// (its terminal chunk is published after the COMPLETED write this test polled for), and
			// a copy that arrives then joins it and gets the same terminal answer. Either way it is
			// the one execution, which the counts below check.
			if o := resp.Header.Get("Oncegate-Idempotency"); o != "replayed" && o != "joined" {
				t.Errorf("final call: Oncegate-Idempotency = %q, want replayed (or joined)", o)
			}
			if k := resp.Header.Get("Idempotency-Key"); k != key {
				t.Errorf("final call: Idempotency-Key = %q, want the derived %q", k, key)
			}
			if len(got.Choices) != 1 || got.Choices[0].Message.Content != wantContent {
				t.Errorf("final call: %+v, want %q", got.Choices, wantContent)
			}
			if got := slow.Stats().Requests - before; got != 1 {
				t.Errorf("backend executions = %d after the final call, want 1", got)
			}
		})
	}
}
