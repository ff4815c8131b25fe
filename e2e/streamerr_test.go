package e2e

import (
	"bytes"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestInStreamErrorEventIsABreak: the backend sends three tokens, then its in-stream error
// chunk and a clean [DONE] (as vLLM does). That is a break of the stream, not an answer: the
// live client gets the three content chunks and exactly one error event (the gateway's,
// naming the backend's message), no [DONE] and not the backend's own error chunk; a retry
// with the same key replays it byte for byte; the backend ran once. Before, the error chunk
// was relayed as content, followed by [DONE], and stored COMPLETED.
func TestInStreamErrorEventIsABreak(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	const key = "in-stream-error-after-3"
	body := mockBody("a stream whose backend reports an error after three tokens", `{"fault":"error_event_after","fault_after":3}`, `"stream":true`)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	b := resp.Body
	if resp.Status != 200 {
		t.Fatalf("status %d: %s", resp.Status, b)
	}
	st := chatStreamOf(t, b) // an error event, if any, is the last
	errors := 0
	for _, d := range st.Data {
		if strings.HasPrefix(d, `{"error":`) {
			errors++
		}
	}
	if got := tokenFrames(t, st.Data); got != 3 || errors != 1 || st.Done || st.ErrCode != "stream_interrupted" {
		t.Errorf("%d token frames, %d error events, [DONE] %v, error code %q; want 3, 1, no [DONE], stream_interrupted:\n%s",
			got, errors, st.Done, st.ErrCode, b)
	}
	if last := st.Data[len(st.Data)-1]; !strings.Contains(last, "reported an error mid-stream: mock in-stream error") ||
		bytes.Contains(b, []byte(`"message":"mock in-stream error"`)) {
		t.Errorf("last event %s: want the gateway's error naming the backend's message, never the backend's chunk", last)
	}
	retry := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	if !bytes.Equal(retry.Body, b) || retry.Header.Get("Oncegate-Idempotency") != "replayed" {
		t.Errorf("same-key retry (%s): %q\nwant the same partial and error: %q", retry.Header.Get("Oncegate-Idempotency"), retry.Body, b)
	}
	if n := mock.Stats().Requests; n != 1 {
		t.Errorf("executions %d, want 1", n)
	}
}
