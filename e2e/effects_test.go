package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	effects "github.com/oncegate/oncegate/client/effects"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// The effects ledger end to end (issue 47): a tool-calling agent loop against a real gateway
// whose backend answers a tool call with a fresh random id on every execution, so a stable id
// can only come from oncegate's replay, and a tool body that counts its runs.

const toolModel = "tool-model"

// toolUpstream answers a chat whose last message is not a tool result with one tool call
// (send_report, a new random id each time), and one that is with a final text quoting it.
func toolUpstream(t *testing.T) *upstream {
	t.Helper()
	return startUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte, _ hit) bool {
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
			return false
		}
		last := req.Messages[len(req.Messages)-1]
		var msg string
		if last.Role == "tool" {
			text, _ := json.Marshal("done: " + last.Content)
			msg = `{"role":"assistant","content":` + string(text) + `},"finish_reason":"stop"`
		} else {
			args, _ := json.Marshal(`{"to":"ops@example.com","subject":"` + last.Content + `"}`)
			msg = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_` + rand.Text() + `","type":"function",` +
				`"function":{"name":"send_report","arguments":` + string(args) + `}}]},"finish_reason":"tool_calls"`
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-%s","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":%s}],`+
			`"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`, rand.Text(), toolModel, msg)
		return true
	})
}

// toolGateway is a gateway config whose tool-model is served by up.
func toolGateway(t *testing.T, up *upstream) *config.Config {
	cfg := gatewaykit.Config(t)
	cfg.Backends = append(cfg.Backends, fastRetryBackend("tools", config.TypeOpenAI, up.base(), toolModel))
	return cfg
}

type toolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolCallOf is the one tool call of a chat completion.
func toolCallOf(body []byte) (toolCall, error) {
	var answer struct {
		Choices []struct {
			Message struct {
				ToolCalls []toolCall `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || len(answer.Choices) == 0 || len(answer.Choices[0].Message.ToolCalls) != 1 {
		return toolCall{}, fmt.Errorf("step 1: no single tool call in %s", body)
	}
	return answer.Choices[0].Message.ToolCalls[0], nil
}

// askTool is the loop's first request: task, with the send_report tool.
func askTool(task string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"tools":[{"type":"function","function":{"name":"send_report","parameters":{"type":"object"}}}]}`, toolModel, task)
}

// agentLoop is one whole run of the caller's loop under key: ask, run the tool call the answer
// holds (through the effects ledger), send its result back, and return the final text and
// the tool call's id.
func agentLoop(ctx context.Context, base, key, task string, c *effects.Client, tool func(context.Context, string) (any, error)) (final, callID string, err error) {
	r := send(http.MethodPost, base+chatPath, askTool(task), map[string]string{"Idempotency-Key": key + "-step1"})
	if r.Err != nil || r.Status != http.StatusOK {
		return "", "", fmt.Errorf("step 1: %d %s %v", r.Status, r.Body, r.Err)
	}
	call, err := toolCallOf(r.Body)
	if err != nil {
		return "", "", err
	}
	out, err := c.Do(ctx, key+"-step1", call.ID, json.RawMessage(call.Function.Arguments), tool)
	if err != nil {
		return "", call.ID, err
	}
	callJSON, _ := json.Marshal(call)
	follow := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q},{"role":"assistant","content":null,"tool_calls":[%s]},{"role":"tool","tool_call_id":%q,"content":%q}]}`,
		toolModel, task, callJSON, call.ID, string(out))
	r = send(http.MethodPost, base+chatPath, follow, map[string]string{"Idempotency-Key": key + "-step2"})
	if r.Err != nil || r.Status != http.StatusOK {
		return "", call.ID, fmt.Errorf("step 2: %d %s %v", r.Status, r.Body, r.Err)
	}
	var second struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.Body, &second); err != nil || len(second.Choices) == 0 {
		return "", call.ID, fmt.Errorf("step 2: %s", r.Body)
	}
	return second.Choices[0].Message.Content, call.ID, nil
}

// countingTool is a tool body that counts its runs and answers with its effect key.
func countingTool(runs *atomic.Int32) func(context.Context, string) (any, error) {
	return func(_ context.Context, effectKey string) (any, error) {
		n := runs.Add(1)
		return json.RawMessage(fmt.Sprintf(`{"sent": true,  "run": %d, "effect_key": %q}`, n, effectKey)), nil
	}
}

// TestEffectsAgentLoopRetried: the whole loop run twice: the second run gets the first's
// answers (the same tool call id), the tool's recorded result byte for byte, and the tool
// body runs once; the same effect with other arguments is refused.
func TestEffectsAgentLoopRetried(t *testing.T) {
	t.Parallel()
	up := toolUpstream(t)
	gw := gatewaykit.StartGateway(t, toolGateway(t, up))
	c := &effects.Client{BaseURL: gw.URL, HTTP: httpClient}
	var runs atomic.Int32
	ctx := context.Background()
	final1, id1, err := agentLoop(ctx, gw.URL, "loop", "weekly report", c, countingTool(&runs))
	if err != nil {
		t.Fatal(err)
	}
	final2, id2, err := agentLoop(ctx, gw.URL, "loop", "weekly report", c, countingTool(&runs))
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || id1 != id2 || final1 != final2 {
		t.Fatalf("tool ran %d times; call ids %s and %s; finals %q and %q: want one run, one id, one answer", runs.Load(), id1, id2, final1, final2)
	}
	if !strings.Contains(final1, `{\"sent\": true,  \"run\": 1,`) && !strings.Contains(final1, `{"sent": true,  "run": 1,`) {
		t.Errorf("the final answer does not quote the tool's first (and only) result byte for byte: %q", final1)
	}
	if n := len(up.Hits()); n != 2 {
		t.Errorf("the backend ran %d executions, want 2 (one per step; the retried loop was replayed)", n)
	}
	_, err = c.Do(ctx, "loop-step1", id1, json.RawMessage(`{"to":"someone-else@example.com"}`), countingTool(&runs))
	if !errors.Is(err, effects.ErrArgumentsChanged) || runs.Load() != 1 {
		t.Fatalf("the same effect with other arguments: %v (tool runs %d), want ErrArgumentsChanged and no run", err, runs.Load())
	}
}

// TestEffectsTwoNodesAtOnce: the same loop twice at once, on two gateways sharing one NATS:
// both get one answer, one tool call id and one result; the tool body runs once, the other
// copy waits for it (409 in_progress, Retry-After) and gets the recorded result.
func TestEffectsTwoNodesAtOnce(t *testing.T) {
	t.Parallel()
	up := toolUpstream(t)
	acfg := toolGateway(t, up)
	acfg.NATS.Listen = "127.0.0.1:0"
	a := gatewaykit.StartGateway(t, acfg)
	bcfg := toolGateway(t, up)
	bcfg.NATS.URL = a.NATSURL()
	b := gatewaykit.StartGateway(t, bcfg)

	var runs atomic.Int32
	waited := func() error { // some node has told a claim the effect is in progress
		for _, g := range []*gatewaykit.Gateway{a, b} {
			if effectEvents(t, g.Metrics().Registry(), "in_progress") > 0 {
				return nil
			}
		}
		return errors.New("no claim was told in_progress yet")
	}
	tool := func(ctx context.Context, key string) (any, error) {
		for waited() != nil { // hold the effect until the other copy has found it held (not t.Fatal: a goroutine)
			if err := ctx.Err(); err != nil {
				return nil, effects.NotRun(err)
			}
			time.Sleep(pollEvery) // a poll of the metrics, as testkit.CheckFor does
		}
		return countingTool(&runs)(ctx, key)
	}
	type out struct {
		final, id string
		err       error
	}
	outs := make([]out, 2)
	var wg sync.WaitGroup
	for i, g := range []*gatewaykit.Gateway{a, b} {
		wg.Go(func() {
			c := &effects.Client{BaseURL: g.URL, HTTP: httpClient}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			outs[i].final, outs[i].id, outs[i].err = agentLoop(ctx, g.URL, "twice", "monthly report", c, tool)
		})
	}
	wg.Wait()
	for i, o := range outs {
		if o.err != nil {
			t.Fatalf("loop %d: %v", i, o.err)
		}
	}
	if runs.Load() != 1 || outs[0].id != outs[1].id || outs[0].final != outs[1].final {
		t.Fatalf("tool ran %d times; ids %s, %s; finals %q, %q: want one run, one id, one answer", runs.Load(), outs[0].id, outs[1].id, outs[0].final, outs[1].final)
	}
}

// effectEvents is oncegate_effects_total{event} in reg.
func effectEvents(t *testing.T, reg *prometheus.Registry, event string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Error(err)
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "oncegate_effects_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" && l.GetValue() == event {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// effectURL is the effects API's URL of effect name under key (suffix: "", "/unknown"...).
func effectURL(base, key, name, suffix string) string {
	return base + "/v1/idempotency/" + url.PathEscape(key) + "/effects/" + url.PathEscape(name) + suffix
}

// TestEffectsCrashAfterTheEffect: a caller dies between its side effect and recording it
// (claimed, the effect done, never completed). The retried loop is never run silently again:
// once the claim's lease lapses, the effect needs reconciling (409 needs_reconcile, a new
// fence), the dead caller's completion with its old fence is refused, and a reconciler that
// finds the effect downstream (by its effect key) records it; the tool body ran once.
func TestEffectsCrashAfterTheEffect(t *testing.T) {
	t.Parallel()
	up := toolUpstream(t)
	gw := gatewaykit.StartGateway(t, toolGateway(t, up))
	var runs atomic.Int32
	downstream := sync.Map{} // effect key -> what the downstream system did (it keeps its own record)
	ctx := context.Background()

	// The first run: the model call, the claim, the side effect; then the caller is gone.
	first := do(t, http.MethodPost, gw.URL+chatPath, askTool("crash report"), map[string]string{"Idempotency-Key": "crash-step1"})
	call, err := toolCallOf(first.Body)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := effects.Fingerprint(json.RawMessage(call.Function.Arguments))
	if err != nil {
		t.Fatal(err)
	}
	claim := do(t, http.MethodPost, effectURL(gw.URL, "crash-step1", call.ID, ""), fmt.Sprintf(`{"fingerprint":%q,"lease_ms":300}`, fp), nil)
	var held struct {
		State     string `json:"state"`
		Fence     uint64 `json:"fence"`
		EffectKey string `json:"effect_key"`
	}
	if err := json.Unmarshal(claim.Body, &held); err != nil || claim.Status != http.StatusCreated || held.State != "claimed" {
		t.Fatalf("claim: %d %s", claim.Status, claim.Body)
	}
	runs.Add(1)
	downstream.Store(held.EffectKey, `{"sent":true,"by":"the caller that died"}`)

	// The retried loop, while the dead caller's lease runs: told to wait.
	busy := do(t, http.MethodPost, effectURL(gw.URL, "crash-step1", call.ID, ""), fmt.Sprintf(`{"fingerprint":%q}`, fp), nil)
	if busy.Status != http.StatusConflict || !strings.Contains(string(busy.Body), `"state":"in_progress"`) || busy.Header.Get("Retry-After") == "" {
		t.Fatalf("a claim during the lease: %d %s Retry-After %q; want 409 in_progress with Retry-After", busy.Status, busy.Body, busy.Header.Get("Retry-After"))
	}
	// After the lease: the retried loop's Do, without a reconciler, never runs the tool.
	c := &effects.Client{BaseURL: gw.URL, HTTP: httpClient}
	var rerr *effects.ReconcileError
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		_, err := c.Do(ctx, "crash-step1", call.ID, json.RawMessage(call.Function.Arguments), countingTool(&runs))
		if errors.As(err, &rerr) {
			return nil
		}
		return fmt.Errorf("Do: %v", err)
	})
	if runs.Load() != 1 || rerr.EffectKey != held.EffectKey || rerr.Fence <= held.Fence {
		t.Fatalf("after the lapse: tool runs %d, %+v; want no second run, the same effect key, a new fence above %d", runs.Load(), rerr, held.Fence)
	}
	// The dead caller's completion, arriving late, is refused.
	late := do(t, http.MethodPut, effectURL(gw.URL, "crash-step1", call.ID, ""), fmt.Sprintf(`{"fence":%d,"result":{"late":true}}`, held.Fence), nil)
	expectError(t, late, http.StatusConflict, "effect_stale_fence")

	// A reconciler asks downstream by the effect key: found, its result is recorded and replayed.
	c.Reconcile = func(_ context.Context, effectKey string) (json.RawMessage, bool, error) {
		v, ok := downstream.Load(effectKey)
		if !ok {
			return nil, false, nil
		}
		return json.RawMessage(v.(string)), true, nil
	}
	final, _, err := agentLoop(ctx, gw.URL, "crash", "crash report", c, countingTool(&runs))
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || !strings.Contains(final, "the caller that died") {
		t.Fatalf("after reconciling: tool runs %d, final %q; want one run and the downstream record", runs.Load(), final)
	}

	// A tool that fails without knowing whether it acted leaves the effect needing
	// reconciliation: the next Do does not run it.
	failing := func(context.Context, string) (any, error) {
		runs.Add(1)
		return nil, errors.New("timeout talking to the mail server")
	}
	c.Reconcile = nil
	if _, err := c.Do(ctx, "crash-step1", "call_unknown", json.RawMessage(`{}`), failing); !errors.Is(err, effects.ErrOutcomeUnknown) {
		t.Fatalf("a failing tool: %v, want ErrOutcomeUnknown", err)
	}
	if _, err := c.Do(ctx, "crash-step1", "call_unknown", json.RawMessage(`{}`), failing); !errors.Is(err, effects.ErrNeedsReconcile) || runs.Load() != 2 {
		t.Fatalf("after an unknown outcome: %v (runs %d), want ErrNeedsReconcile and no new run", err, runs.Load())
	}
	// One that knows it did nothing releases its claim: the next Do runs it.
	notRun := func(context.Context, string) (any, error) { return nil, effects.NotRun(errors.New("invalid address")) }
	if _, err := c.Do(ctx, "crash-step1", "call_notrun", json.RawMessage(`{}`), notRun); !errors.Is(err, effects.ErrNotRun) {
		t.Fatalf("a tool that did not run: %v, want ErrNotRun", err)
	}
	if out, err := c.Do(ctx, "crash-step1", "call_notrun", json.RawMessage(`{}`), countingTool(&runs)); err != nil || !strings.Contains(string(out), `"run": 3`) {
		t.Fatalf("after a release: %s %v, want the tool's run", out, err)
	}
}

// TestEffectsAPIRefusals: the effects API's bad input is a 400 in the API's error format and
// writes nothing; an intent that is not the caller's tenant's is a 404.
func TestEffectsAPIRefusals(t *testing.T) {
	t.Parallel()
	up := toolUpstream(t)
	cfg := toolGateway(t, up)
	cfg.Tenants = []config.Tenant{{ID: "t1", APIKeysSHA256: []string{sha("key-1")}}, {ID: "t2", APIKeysSHA256: []string{sha("key-2")}}}
	gw := gatewaykit.StartGateway(t, cfg)
	as := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }
	ask := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"refusals"}]}`, toolModel)
	if r := do(t, http.MethodPost, gw.URL+chatPath, ask, map[string]string{"Authorization": "Bearer key-1", "Idempotency-Key": "ref"}); r.Status != http.StatusOK {
		t.Fatalf("the intent: %d %s", r.Status, r.Body)
	}
	long := strings.Repeat("x", 129)
	cases := []struct {
		name, method, url, body, key string
		status                       int
		code                         string
	}{
		{"not JSON", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":`, "key-1", 400, "invalid_request"},
		{"unknown member", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f","lease":5}`, "key-1", 400, "invalid_request"},
		{"no fingerprint", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"lease_ms":1000}`, "key-1", 400, "missing_required_parameter"},
		{"lease too short", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f","lease_ms":5}`, "key-1", 400, "invalid_value"},
		{"lease too long", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f","lease_ms":3600001}`, "key-1", 400, "invalid_value"},
		{"name too long", http.MethodPost, effectURL(gw.URL, "ref", long, ""), `{"fingerprint":"f"}`, "key-1", 400, "invalid_effect_name"},
		{"name with a space", http.MethodPost, effectURL(gw.URL, "ref", "call 1", ""), `{"fingerprint":"f"}`, "key-1", 400, "invalid_effect_name"},
		{"complete without a fence", http.MethodPut, effectURL(gw.URL, "ref", "call_1", ""), `{"result":1}`, "key-1", 400, "missing_required_parameter"},
		{"complete without a result", http.MethodPut, effectURL(gw.URL, "ref", "call_1", ""), `{"fence":1}`, "key-1", 400, "missing_required_parameter"},
		{"unknown without a fence", http.MethodPost, effectURL(gw.URL, "ref", "call_1", "/unknown"), `{}`, "key-1", 400, "missing_required_parameter"},
		{"complete, never claimed", http.MethodPut, effectURL(gw.URL, "ref", "call_1", ""), `{"fence":1,"result":1}`, "key-1", 404, "effect_not_found"},
		{"another tenant's intent", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f"}`, "key-2", 404, "not_found"},
		{"another tenant's list", http.MethodGet, gw.URL + "/v1/idempotency/ref/effects", "", "key-2", 404, "not_found"},
		{"no such intent", http.MethodPost, effectURL(gw.URL, "nothing", "call_1", ""), `{"fingerprint":"f"}`, "key-1", 404, "not_found"},
		{"no API key", http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f"}`, "", 401, "missing_api_key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.key != "" {
				hdr = as(tc.key)
			}
			expectError(t, do(t, tc.method, tc.url, tc.body, hdr), tc.status, tc.code)
		})
	}
	list := do(t, http.MethodGet, gw.URL+"/v1/idempotency/ref/effects", "", as("key-1"))
	if list.Status != http.StatusOK || string(list.Body) != `{"object":"list","data":[]}` {
		t.Fatalf("after the refusals: %d %s, want an empty list", list.Status, list.Body)
	}
	claim := do(t, http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f1"}`, as("key-1"))
	if claim.Status != http.StatusCreated {
		t.Fatalf("a good claim: %d %s", claim.Status, claim.Body)
	}
	expectError(t, do(t, http.MethodPost, effectURL(gw.URL, "ref", "call_1", ""), `{"fingerprint":"f2"}`, as("key-1")), 422, "effect_arguments_changed")
	list = do(t, http.MethodGet, gw.URL+"/v1/idempotency/ref/effects", "", as("key-1"))
	if list.Status != http.StatusOK || !strings.Contains(string(list.Body), `"name":"call_1","state":"claimed"`) || strings.Contains(string(list.Body), `"fence"`) {
		t.Fatalf("the list: %d %s, want call_1 claimed (its fence not shown)", list.Status, list.Body)
	}
}

// TestEffectsLeaseRenewed: a tool that runs several of its claim's leases long keeps the
// effect (Do renews the lease while it runs): another caller's claim meanwhile is told
// in_progress, never needs_reconcile, and the tool's result is recorded with its fence.
func TestEffectsLeaseRenewed(t *testing.T) {
	t.Parallel()
	up := toolUpstream(t)
	gw := gatewaykit.StartGateway(t, toolGateway(t, up))
	first := do(t, http.MethodPost, gw.URL+chatPath, askTool("slow report"), map[string]string{"Idempotency-Key": "slow-step1"})
	call, err := toolCallOf(first.Body)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 300 * time.Millisecond
	c := &effects.Client{BaseURL: gw.URL, HTTP: httpClient, Lease: lease}
	fp, err := effects.Fingerprint(json.RawMessage(call.Function.Arguments))
	if err != nil {
		t.Fatal(err)
	}
	var other result
	out, err := c.Do(context.Background(), "slow-step1", call.ID, json.RawMessage(call.Function.Arguments), func(ctx context.Context, _ string) (any, error) {
		select { // the scenario: a tool that outlasts four leases (not a synchronisation)
		case <-time.After(4 * lease):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		other = send(http.MethodPost, effectURL(gw.URL, "slow-step1", call.ID, ""), fmt.Sprintf(`{"fingerprint":%q}`, fp), nil)
		return map[string]bool{"slow": true}, nil
	})
	if err != nil || string(out) != `{"slow":true}` {
		t.Fatalf("Do: %s %v, want the slow tool's result", out, err)
	}
	if other.Status != http.StatusConflict || !strings.Contains(string(other.Body), `"state":"in_progress"`) {
		t.Fatalf("a claim four leases into the run: %d %s, want 409 in_progress", other.Status, other.Body)
	}
}

// TestNodeSDKEffects: the official OpenAI Node SDK (testdata/node/effects.mjs) in a
// tool-calling loop run twice as a whole, its tool through the effects API by plain fetch: one
// tool call id (through the auto key the answer echoes), one recorded result, and the tool's
// side effect (a POST to a sink standing for the downstream system) happens once.
func TestNodeSDKEffects(t *testing.T) {
	node := requireNodeSDK(t)
	t.Parallel()
	up := toolUpstream(t)
	gw := gatewaykit.StartGateway(t, toolGateway(t, up))
	var mu sync.Mutex
	var sunk []string // the Idempotency-Key (effect key) of each side effect the sink saw
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sunk = append(sunk, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
	}))
	t.Cleanup(sink.Close)
	type loop struct {
		Key, CallID, Final string
		Result             struct {
			Sent bool
			Run  int
		}
	}
	var got struct{ First, Second loop }
	runNodeScript(t, node, "effects.mjs", &got, "ONCEGATE_BASE="+gw.URL, "ONCEGATE_MODEL="+toolModel,
		"ONCEGATE_TAG="+rand.Text(), "ONCEGATE_SINK="+sink.URL)
	mu.Lock()
	defer mu.Unlock()
	if len(sunk) != 1 || len(sunk[0]) != 32 {
		t.Fatalf("the sink saw %d side effects %q, want one with its effect key", len(sunk), sunk)
	}
	f, s := got.First, got.Second
	if !strings.HasPrefix(f.Key, "auto-") || f.Key != s.Key || f.CallID != s.CallID || f.Final != s.Final ||
		f.Result.Run != 1 || s.Result.Run != 1 || !f.Result.Sent {
		t.Fatalf("the two runs: %+v and %+v; want one auto key, one tool call id, the first run's result and answer twice", f, s)
	}
}
