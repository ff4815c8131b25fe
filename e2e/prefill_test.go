package e2e

// Anthropic continuation end to end: a stream that breaks is continued with the text already
// sent as assistant prefill (the mock continues after a final assistant message as Anthropic
// does), and the client's text equals the unbroken answer's, whatever letters the prefix ends in.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// pfEvent is one named SSE event of an Anthropic stream.
type pfEvent struct {
	name string
	data map[string]any
}

// pfEvents is the events of an Anthropic stream, their data decoded.
func pfEvents(t testing.TB, body []byte) []pfEvent {
	t.Helper()
	evs, err := sseEvents(body)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]pfEvent, len(evs))
	for i, ev := range evs {
		out[i].name = ev.Event
		if err := json.Unmarshal([]byte(ev.Data), &out[i].data); err != nil {
			t.Fatalf("event data is not JSON: %v: %q", err, ev.Raw)
		}
	}
	return out
}

// pfText is the text of an Anthropic stream and how many of each event it has.
func pfText(t testing.TB, body []byte) (string, map[string]int) {
	t.Helper()
	var text strings.Builder
	counts := map[string]int{}
	for _, ev := range pfEvents(t, body) {
		counts[ev.name]++
		if ev.name == "content_block_delta" {
			if d, _ := ev.data["delta"].(map[string]any); d["type"] == "text_delta" {
				text.WriteString(d["text"].(string))
			}
		}
	}
	return text.String(), counts
}

func pfBody(msg, knobs string) string {
	m, _ := json.Marshal(msg)
	body := `{"model":"oncegate-mock","max_tokens":16,"stream":true,"messages":[{"role":"user","content":` + string(m) + `}]`
	if knobs != "" {
		body += `,"mock":` + knobs
	}
	return body + "}"
}

func pfPost(t testing.TB, gw *gatewaykit.Gateway, msg, knobs, key string) result {
	t.Helper()
	return do(t, http.MethodPost, gw.URL+"/v1/messages", pfBody(msg, knobs), map[string]string{"Idempotency-Key": key})
}

// pfSDKText reads a stream with the official Anthropic SDK (which must accept the "oncegate"
// member of a continued stream's message_delta) and returns its accumulated text.
func pfSDKText(t testing.TB, gw *gatewaykit.Gateway, body, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := anthropicClient(gw)
	stream := client.Messages.NewStreaming(ctx, anthropic.MessageNewParams{},
		option.WithRequestBody("application/json", []byte(body)), option.WithHeader("Idempotency-Key", key))
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatalf("SDK accumulate: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("SDK stream: %v", err)
	}
	return messageText(&acc)
}

// pfOutputTokens is the output_tokens of an Anthropic stream's message_delta.
func pfOutputTokens(t testing.TB, body []byte) any {
	t.Helper()
	for _, ev := range pfEvents(t, body) {
		if ev.name == "message_delta" {
			u, _ := ev.data["usage"].(map[string]any)
			return u["output_tokens"]
		}
	}
	return nil
}

// pfBreakAfter is the first token count n (1 ≤ n < len) whose text ends with a letter for
// which wantLetter holds: where the stream is broken.
func pfBreakAfter(t testing.TB, text string, wantLetter func(byte) bool) int {
	t.Helper()
	words := strings.Fields(text)
	for n := 1; n < len(words); n++ {
		if w := words[n-1]; wantLetter(w[len(w)-1]) {
			return n
		}
	}
	t.Fatalf("no token of %q ends as wanted", text)
	return 0
}

func TestContinuationAnthropicPrefill(t *testing.T) {
	up := startUpstream(t, nil)
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("anthropic-up", config.TypeAnthropic, up.base(), "oncegate-mock")
	b.Continuation = config.ContinuationAnthropic
	b.PrefillModels = []string{"oncegate-mock"}
	cfg.Backends = append(cfg.Backends, b)
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"anthropic-up"}}}
	gw := gatewaykit.StartGateway(t, cfg)

	tests := []struct {
		name   string
		msg    string
		letter func(byte) bool
	}{
		// The old trim cut the letters t, r, n (and backslashes) off the prefill.
		{"prefix ends in t, r or n", "prefill: a prefix whose last letter is t r or n", func(c byte) bool { return strings.IndexByte("trn", c) >= 0 }},
		{"prefix ends in another letter", "prefill: a prefix ending in another letter", func(c byte) bool { return strings.IndexByte("trn", c) < 0 }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := pfPost(t, gw, tt.msg, "", fmt.Sprintf("pf-clean-%d", i))
			clean := resp.Body
			if resp.Status != http.StatusOK {
				t.Fatalf("clean run: %d %s", resp.Status, clean)
			}
			want, _ := pfText(t, clean)
			n := pfBreakAfter(t, want, tt.letter)
			before := up.Mock.Stats().Requests

			knobs := fmt.Sprintf(`{"fault":"drop_after","fault_after":%d,"fault_first_n":1}`, n)
			key := fmt.Sprintf("pf-broken-%d", i)
			resp = pfPost(t, gw, tt.msg, knobs, key)
			rb := resp.Body
			if resp.Status != http.StatusOK {
				t.Fatalf("status %d: %s", resp.Status, rb)
			}
			got, counts := pfText(t, rb)
			if got != want {
				t.Errorf("broken after %d tokens, continued: text %q\nwant the clean run's %q", n, got, want)
			}
			for _, ev := range []string{"message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"} {
				if counts[ev] != 1 {
					t.Errorf("%d %s events, want 1 (one message): %v", counts[ev], ev, counts)
				}
			}
			// The final figure of attempts is in message_delta (the header went out before the
			// continuation): the broken attempt and its continuation.
			// Its usage is the whole answer's, as the clean run's says.
			for _, ev := range pfEvents(t, rb) {
				if ev.name == "message_delta" {
					if m, _ := json.Marshal(ev.data["oncegate"]); string(m) != `{"attempts":2,"resumed":1}` {
						t.Errorf("message_delta oncegate member %s, want attempts 2, resumed 1", m)
					}
					if got, want := pfOutputTokens(t, rb), pfOutputTokens(t, clean); got != want {
						t.Errorf("message_delta output_tokens %v, want the clean run's %v", got, want)
					}
				}
			}
			if counts["error"] != 0 {
				t.Errorf("an error event in a continued stream: %s", rb)
			}
			if r := up.Mock.Stats().Requests - before; r != 2 {
				t.Errorf("%d backend requests, want 2 (the broken one and its continuation)", r)
			}
			retry := pfPost(t, gw, tt.msg, knobs, key)
			rrb := retry.Body
			if retry.Header.Get("Oncegate-Idempotency") != "replayed" || !bytes.Equal(rrb, rb) {
				t.Errorf("same-key retry (%s) differs from the live stream", retry.Header.Get("Oncegate-Idempotency"))
			}
			if got := pfSDKText(t, gw, pfBody(tt.msg, knobs), key); got != want {
				t.Errorf("the SDK reads the continued stream as %q, want %q", got, want)
			}
		})
	}
}
