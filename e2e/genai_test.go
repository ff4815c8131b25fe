package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// holdWriter passes a mock's stream on, and holds the first write after the one that carried
// content until release is closed (or the request ends).
type holdWriter struct {
	http.ResponseWriter
	release <-chan struct{}
	done    <-chan struct{}
	content bool
}

func (h *holdWriter) Write(p []byte) (int, error) {
	if h.content {
		select {
		case <-h.release:
		case <-h.done:
		}
	}
	h.content = h.content || (bytes.Contains(p, []byte(`"content":"`)) && !bytes.Contains(p, []byte(`"content":""`)))
	return h.ResponseWriter.Write(p)
}

func (h *holdWriter) Flush() { http.NewResponseController(h.ResponseWriter).Flush() }

func (h *holdWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// genAIGateway is a gateway whose spans go to an in-memory exporter, in front of an
// OpenAI-compatible upstream that holds the first execution of intent "genai" after its first
// content until release is closed (so that a copy can join it).
func genAIGateway(t *testing.T, capture bool) (*gatewaykit.Gateway, *upstream, *tracetest.InMemoryExporter, chan struct{}) {
	exp := tracetest.NewInMemoryExporter()
	release := make(chan struct{})
	var held atomic.Bool
	var up *upstream
	up = startUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte, h hit) bool {
		if h.intent != "genai" || held.Swap(true) {
			return false
		}
		up.Mock.ServeHTTP(&holdWriter{ResponseWriter: w, release: release, done: r.Context().Done()}, r)
		return true
	})
	cfg := gatewaykit.Config(t)
	cfg.Backends = append(cfg.Backends, fastRetryBackend("upstream", config.TypeOpenAI, up.base(), "oncegate-mock"))
	cfg.Routes = []config.Route{{Model: "oncegate-mock", Backends: []string{"upstream"}}}
	cfg.Tracing.CaptureContent = capture
	gw := gatewaykit.StartGatewayEnv(t, cfg, func(string) string { return "" }, gateway.WithSpanExporter(exp))
	return gw, up, exp, release
}

// streamUsage is the model, id, finish reason and usage of a chat stream's payloads.
func streamUsage(t *testing.T, data []string) (model, id, finish string, in, out int) {
	t.Helper()
	for _, d := range data {
		var c struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(d), &c) != nil {
			continue
		}
		model, id = c.Model, c.ID
		for _, ch := range c.Choices {
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			in, out = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
	}
	if in == 0 || out == 0 || finish == "" {
		t.Fatalf("the stream has no usage or finish reason: %q", data)
	}
	return model, id, finish, in, out
}

// attrs is a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// checkAttrs fails for each key of want the span lacks or holds another value of, and for
// each key of absent it holds.
func checkAttrs(t *testing.T, what string, s sdktrace.ReadOnlySpan, want map[attribute.Key]any, absent ...attribute.Key) {
	t.Helper()
	got := attrs(s)
	for k, w := range want {
		v, ok := got[k]
		if !ok {
			t.Errorf("%s span %q: no %s", what, s.Name(), k)
			continue
		}
		if fmt.Sprint(v.AsInterface()) != fmt.Sprint(w) {
			t.Errorf("%s span %q: %s = %v, want %v", what, s.Name(), k, v.AsInterface(), w)
		}
	}
	for _, k := range absent {
		if v, ok := got[k]; ok {
			t.Errorf("%s span %q: %s = %v, want none", what, s.Name(), k, v.AsInterface())
		}
	}
}

// histogram is the sample count and sum of the histogram series name{labels} (all labels).
func histogram(t *testing.T, m *telemetry.Metrics, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			for k, v := range labels {
				if labelOf(s, k) != v {
					continue series
				}
			}
			count += s.GetHistogram().GetSampleCount()
			sum += s.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

func labelOf(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestGenAITelemetry: one new intent (streamed), one copy joined to it while it runs and one
// replay afterwards. The execution's span and the backend attempt's span carry the
// OpenTelemetry GenAI attributes (semantic conventions 1.41.0) with the values the answer
// says; the three request spans say created, joined and replayed with the request's model,
// and no copy adds an execution, an attempt or a histogram sample: each GenAI histogram has
// the one operation, with the stream's usage as its token counts. Content is not captured.
func TestGenAITelemetry(t *testing.T) {
	gw, up, exp, release := genAIGateway(t, false)
	body := chatBody("oncegate-mock", "genai", `"stream":true,"stream_options":{"include_usage":true}`)
	key := map[string]string{"Idempotency-Key": "genai-1"}
	// The creator's stream starts (its headers come with its first content); the copy's
	// starts too while the upstream holds the rest of the execution.
	creatorResp, err := openStream(http.MethodPost, gw.URL+chatPath, body, key)
	if err != nil {
		t.Fatal(err)
	}
	creator := async(func() result {
		defer creatorResp.Body.Close()
		b, err := io.ReadAll(creatorResp.Body)
		return result{Status: creatorResp.StatusCode, Header: creatorResp.Header, Body: b, Err: err}
	})
	joiner, err := openStream(http.MethodPost, gw.URL+chatPath, body, key)
	if err != nil {
		t.Fatal(err)
	}
	if o := joiner.Header.Get("Oncegate-Idempotency"); o != "joined" {
		t.Fatalf("the copy is %q, want joined", o)
	}
	close(release)
	joined, err := io.ReadAll(joiner.Body)
	joiner.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	first := testkit.RequireChanRead(t, creator, 30*time.Second)
	expect(t, first, http.StatusOK, "created")
	st := chatStreamOf(t, first.Body)
	if string(joined) != string(first.Body) {
		t.Fatalf("the joined copy's stream differs from the original")
	}
	if n := len(up.Hits()); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1", n)
	}
	expect(t, postChat(t, gw.URL, body, key), http.StatusOK, "replayed")
	model, id, finish, in, out := streamUsage(t, st.Data)

	var server, exec, attempt []sdktrace.ReadOnlySpan
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		server, exec, attempt = nil, nil, nil
		for _, s := range exp.GetSpans().Snapshots() {
			switch s.SpanKind() {
			case trace.SpanKindServer:
				server = append(server, s)
			case trace.SpanKindConsumer:
				exec = append(exec, s)
			case trace.SpanKindClient:
				attempt = append(attempt, s)
			}
		}
		if len(server) != 3 || len(exec) != 1 || len(attempt) != 1 {
			return fmt.Errorf("spans: %d request, %d execution, %d attempt; want 3, 1, 1", len(server), len(exec), len(attempt))
		}
		return nil
	})
	u, _ := url.Parse(up.URL)
	host, port, _ := net.SplitHostPort(u.Host)
	answer := map[attribute.Key]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "oncegate-mock",
		"gen_ai.response.model": model, "gen_ai.response.id": id, "gen_ai.response.finish_reasons": []string{finish},
		"gen_ai.usage.input_tokens": in, "gen_ai.usage.output_tokens": out,
	}
	content := []attribute.Key{"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions"}
	if attempt[0].Name() != "chat oncegate-mock" {
		t.Errorf("the attempt's span is named %q, want %q", attempt[0].Name(), "chat oncegate-mock")
	}
	withServer := map[attribute.Key]any{"server.address": host, "server.port": port, "oncegate.backend": "upstream"}
	for k, v := range answer {
		withServer[k] = v
	}
	checkAttrs(t, "attempt", attempt[0], withServer, append(content, "error.type")...)
	execWant := map[attribute.Key]any{"oncegate.outcome": "COMPLETED", "oncegate.epoch": 1, "oncegate.stream": true,
		"oncegate.idem_key_hash": attrs(server[0])["oncegate.idem_key_hash"].AsString()}
	for k, v := range answer {
		execWant[k] = v
	}
	checkAttrs(t, "execution", exec[0], execWant, append(content, "error.type")...)
	if attempt[0].Parent().SpanID() != exec[0].SpanContext().SpanID() {
		t.Errorf("the attempt's span is not the execution's child")
	}
	outcomes := map[string]bool{}
	for _, s := range server {
		a := attrs(s)
		outcomes[a["oncegate.outcome"].AsString()] = true
		checkAttrs(t, "request", s, map[attribute.Key]any{"gen_ai.operation.name": "chat", "gen_ai.request.model": "oncegate-mock",
			"oncegate.epoch": 1, "oncegate.idem_key_hash": execWant["oncegate.idem_key_hash"]},
			append(content, "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.provider.name")...)
	}
	if !outcomes["created"] || !outcomes["joined"] || !outcomes["replayed"] {
		t.Errorf("request spans' outcomes %v, want created, joined and replayed", outcomes)
	}

	m := gw.Metrics()
	op := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai", "gen_ai_request_model": "oncegate-mock"}
	with := func(k, v string) map[string]string {
		l := map[string]string{k: v}
		for a, b := range op {
			l[a] = b
		}
		return l
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		sum    float64 // -1: any positive
	}{
		{"gen_ai_client_token_usage", with("gen_ai_token_type", "input"), float64(in)},
		{"gen_ai_client_token_usage", with("gen_ai_token_type", "output"), float64(out)},
		{"gen_ai_client_operation_duration_seconds", with("error_type", ""), -1},
		{"gen_ai_client_operation_time_to_first_chunk_seconds", op, -1},
	} {
		n, sum := histogram(t, m, c.name, c.labels)
		if n != 1 || (c.sum >= 0 && sum != c.sum) || (c.sum < 0 && sum <= 0) {
			t.Errorf("%s%v: %d samples summing to %g, want 1 of %s", c.name, c.labels, n, sum, strconv.FormatFloat(c.sum, 'g', -1, 64))
		}
	}
}

// TestGenAIContentCapture: with tracing.capture_content on, the execution's span carries the
// prompt and the answer in the conventions' message format.
func TestGenAIContentCapture(t *testing.T) {
	gw, _, exp, release := genAIGateway(t, true)
	close(release)
	r := postChat(t, gw.URL, chatBody("oncegate-mock", "capture me", ""), map[string]string{"Idempotency-Key": "genai-capture"})
	expect(t, r, http.StatusOK, "created")
	_, text, _ := answerOf(r.Body)
	var exec sdktrace.ReadOnlySpan
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		for _, s := range exp.GetSpans().Snapshots() {
			if s.SpanKind() == trace.SpanKindConsumer {
				exec = s
				return nil
			}
		}
		return errors.New("no execution span yet")
	})
	quoted, _ := json.Marshal(text)
	outMsg := `[{"role":"assistant","parts":[{"type":"text","content":` + string(quoted) + `}],"finish_reason":"stop"}]`
	checkAttrs(t, "execution", exec, map[attribute.Key]any{
		"gen_ai.input.messages":  `[{"role":"user","parts":[{"type":"text","content":"capture me"}]}]`,
		"gen_ai.output.messages": outMsg,
	})
}
