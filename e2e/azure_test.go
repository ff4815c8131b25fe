package e2e

// Azure OpenAI as a backend of a Chat Completions route (issue 35): the azure dialect sends
// the OpenAI wire to /openai/deployments/{deployment}/chat/completions?api-version=… with
// the key in api-key, behind the same exactly-once machinery; the backend is the project's
// mock speaking Azure's paths, key check and error shape on a real 127.0.0.1 listener
// (startWireUpstream and startWireGateway are gemini_test.go's).

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
)

const (
	azureModel      = "gpt-4o"
	azureDeployment = "prod-gpt4o" // the deployment azureModel is mapped to
)

// azureDeployed maps azureModel to azureDeployment.
func azureDeployed(b *config.Backend) { b.Deployments = map[string]string{azureModel: azureDeployment} }

func TestAzureNonStream(t *testing.T) {
	up := startWireUpstream(t, azureDeployment)
	gw := startWireGateway(t, config.TypeAzure, up.URL, azureModel, azureDeployed)
	const msg, key = "azure: one answer", "azure-non-stream"
	body := wireChat(azureModel, msg, false)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	expect(t, resp, 200, "created")
	c := parseCompletion(t, resp.Body)
	// The mock seeds its answer on the deployment it was sent to, as Azure runs the deployment.
	if want := referenceWithSystem(t, azureDeployment, msg); c.Choices[0].Message.Content != want {
		t.Errorf("content %q, want the deployment's %q", c.Choices[0].Message.Content, want)
	}
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d upstream requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.path != "/openai/deployments/"+azureDeployment+"/chat/completions" || r.query != "api-version="+config.DefaultAzureAPIVersion {
		t.Errorf("upstream %s?%s", r.path, r.query)
	}
	if r.header.Get("api-key") != "test-key-123" || r.header.Get("Authorization") != "" {
		t.Errorf("key headers: api-key %q, Authorization %q", r.header.Get("api-key"), r.header.Get("Authorization"))
	}
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(r.body, &sent); err != nil || string(sent["max_tokens"]) != "64" || sent["stream_options"] != nil {
		t.Errorf("upstream body %s: want the client's chat request, not streamed", r.body)
	}
	expectReplayedOnce(t, gw.URL, body, key, resp, up)
}

// A model with no deployments entry goes to the deployment of its own name, with the
// configured api-version; Azure's prompt-filter chunk never reaches the client.
func TestAzureStream(t *testing.T) {
	const model = "gpt-4o-mini"
	up := startWireUpstream(t, model)
	gw := startWireGateway(t, config.TypeAzure, up.URL, model, func(b *config.Backend) { b.APIVersion = "2025-01-01-preview" })
	const msg, key = "azure: one stream", "azure-stream"
	body := wireChat(model, msg, true)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	expect(t, resp, 200, "created")
	st := chatStreamOf(t, resp.Body)
	if want := referenceWithSystem(t, model, msg); st.Content != want || !st.Done {
		t.Errorf("transcript %q (done %v), want %q", st.Content, st.Done, want)
	}
	if finishChunk(st.Data) == "" || usageChunk(st.Data) <= 0 {
		t.Errorf("stream %q: want a finish chunk and the usage chunk asked for", st.Data)
	}
	if bytes.Contains(resp.Body, []byte("prompt_filter_results")) {
		t.Errorf("Azure's prompt-filter chunk reached the client: %s", resp.Body)
	}
	if r := up.requests(); len(r) != 1 || r[0].path != "/openai/deployments/"+model+"/chat/completions" || r[0].query != "api-version=2025-01-01-preview" {
		t.Errorf("upstream requests %+v, want one to the model's deployment with api-version=2025-01-01-preview", r)
	}
	expectReplayedOnce(t, gw.URL, body, key, resp, up)
}

// A stream that breaks after output is kept with an explicit stream_interrupted error (Azure
// cannot continue it), and replayed as it is.
func TestAzureStreamBreaks(t *testing.T) {
	up := startWireUpstream(t, azureDeployment)
	gw := startWireGateway(t, config.TypeAzure, up.URL, azureModel, azureDeployed)
	breaksAfterOutput(t, gw.URL, up, wireChat(azureModel, "azure: a stream that breaks", true), "azure-breaks")
}

// A stream that breaks after Azure's prompt-filter chunk and the role chunk, before the first
// token, had not started for anyone: it is sent again and the client gets one whole answer.
func TestAzureStreamBreaksBeforeFirstToken(t *testing.T) {
	up := startWireUpstream(t, azureDeployment)
	gw := startWireGateway(t, config.TypeAzure, up.URL, azureModel, azureDeployed)
	up.setFaults(map[string]string{"X-Mock-Fault": "drop_after", "X-Mock-Fault-After": "0", "X-Mock-Fault-First-N": "1"})
	const msg = "azure: a stream that breaks before its first token"
	resp := postChat(t, gw.URL, wireChat(azureModel, msg, true), map[string]string{"Idempotency-Key": "azure-breaks-early"})
	expect(t, resp, 200, "created")
	st := chatStreamOf(t, resp.Body)
	if want := referenceWithSystem(t, azureDeployment, msg); st.Content != want || !st.Done || st.ErrCode != "" {
		t.Errorf("transcript %q (done %v, error %q), want %q whole", st.Content, st.Done, st.ErrCode, want)
	}
	if got := strings.Count(string(resp.Body), `"role":"assistant"`); got != 1 {
		t.Errorf("%d role chunks, want 1: %s", got, resp.Body)
	}
	if st := up.Mock.Stats(); st.Requests != 2 || st.Faults != 1 {
		t.Errorf("backend stats %+v, want 2 executions, the first broken", st)
	}
}

// Azure's error bodies reach the client as OpenAI ones, stored and replayed: the content
// filter's 400 (its innererror kept), and the 401 of a key Azure refuses.
func TestAzureErrorBody(t *testing.T) {
	up := startWireUpstream(t, azureDeployment)
	gw := startWireGateway(t, config.TypeAzure, up.URL, azureModel, azureDeployed)
	up.setFaults(map[string]string{"X-Mock-Fault": "content_filter"})
	body := wireChat(azureModel, "azure: filtered", false)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "azure-400"})
	if resp.Status != 400 {
		t.Fatalf("status %d: %s", resp.Status, resp.Body)
	}
	assertOpenAIError(t, resp, "content_filter")
	var e struct {
		Error struct {
			Type       string          `json:"type"`
			Param      string          `json:"param"`
			InnerError json.RawMessage `json:"innererror"`
		} `json:"error"`
	}
	if json.Unmarshal(resp.Body, &e) != nil || e.Error.Type != "invalid_request_error" || e.Error.Param != "prompt" ||
		!bytes.Contains(e.Error.InnerError, []byte(`"ResponsibleAIPolicyViolation"`)) {
		t.Errorf("body %s: want type invalid_request_error, param prompt and Azure's innererror", resp.Body)
	}
	expectReplayedOnce(t, gw.URL, body, "azure-400", resp, up)

	// A key Azure does not accept (the upstream drops the api-key header the gateway sent):
	// Azure's 401, as an OpenAI error. (A backend without api_key_env is refused at start.)
	up.setFaults(map[string]string{"api-key": ""})
	r := postChat(t, gw.URL, wireChat(azureModel, "azure: no key", false), map[string]string{"Idempotency-Key": "azure-401"})
	if r.Status != 401 {
		t.Fatalf("no key: status %d: %s", r.Status, r.Body)
	}
	assertOpenAIError(t, r, "401")
	if !strings.Contains(string(r.Body), `"type":"authentication_error"`) || !strings.Contains(string(r.Body), "Access denied") {
		t.Errorf("no key: body %s, want an authentication_error with Azure's message", r.Body)
	}
}

// expectReplayedOnce: a same-key retry of body is replayed byte for byte as first, and the
// backend ran once.
func expectReplayedOnce(t *testing.T, base, body, key string, first result, up *wireUpstream) {
	t.Helper()
	retry := postChat(t, base, body, map[string]string{"Idempotency-Key": key})
	expect(t, retry, first.Status, "replayed")
	if !bytes.Equal(retry.Body, first.Body) {
		t.Errorf("replay differs from the first answer:\n%s\n%s", retry.Body, first.Body)
	}
	if st := up.Mock.Stats(); st.Requests != 1 {
		t.Errorf("backend executions %d, want 1", st.Requests)
	}
}
