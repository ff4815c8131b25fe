package e2e

// Amazon Bedrock as a backend of a Chat Completions route (issue 48): the bedrock dialect
// translates the request to Converse / ConverseStream, signs it with SigV4 from the AWS
// credential chain (here its environment variables), reads ConverseStream's binary event
// stream and the answer back, behind the same exactly-once machinery; the backend is the
// project's mock speaking Bedrock's wire on a real 127.0.0.1 listener and checking each
// request's signature.

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

const (
	bedrockModel   = "claude-haiku"                           // the route's model
	bedrockModelID = "anthropic.claude-3-haiku-20240307-v1:0" // its Bedrock model id
	bedrockSecret  = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)

// awsEnv gives the gateway's credential chain the test's credentials (and nothing of the
// machine's: no shared files, no instance metadata).
func awsEnv(t *testing.T, secret string) {
	dir := t.TempDir()
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": "session-token",
		"AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_PROFILE": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": ""} {
		t.Setenv(k, v)
	}
}

// startBedrock starts the mock Bedrock (checking signatures with bedrockSecret) and a gateway
// whose route for bedrockModel goes to it, signing with secret.
func startBedrock(t *testing.T, secret string) (*gatewaykit.Gateway, *wireUpstream) {
	t.Helper()
	awsEnv(t, secret)
	up := startWireUpstreamWith(t, mockllm.Options{Models: []string{bedrockModelID}, AWSSecretKey: bedrockSecret})
	gw := startWireGateway(t, config.TypeBedrock, up.URL, bedrockModel, func(b *config.Backend) {
		b.APIKeyEnv, b.Region = "", "us-west-2"
		b.ModelIDs = map[string]string{bedrockModel: bedrockModelID}
	})
	return gw, up
}

// checkSigned: the upstream got one request on path, signed with SigV4 for us-west-2 and
// service bedrock, with the session token.
func checkSigned(t *testing.T, up *wireUpstream, path string) seenRequest {
	t.Helper()
	reqs := up.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d upstream requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.path != path {
		t.Errorf("upstream path %s, want %s", r.path, path)
	}
	if auth := r.header.Get("Authorization"); !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") || !strings.Contains(auth, "/us-west-2/bedrock/aws4_request") ||
		r.header.Get("X-Amz-Security-Token") != "session-token" {
		t.Errorf("upstream signature: Authorization %q, token %q", auth, r.header.Get("X-Amz-Security-Token"))
	}
	return r
}

func TestBedrockNonStream(t *testing.T) {
	gw, up := startBedrock(t, bedrockSecret)
	const msg, key = "bedrock: one answer", "bedrock-non-stream"
	body := wireChat(bedrockModel, msg, false)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	expect(t, resp, http.StatusOK, "created")
	c := parseCompletion(t, resp.Body)
	if want := referenceWithSystem(t, bedrockModelID, msg); c.Choices[0].Message.Content != want {
		t.Errorf("content %q, want the backend's %q", c.Choices[0].Message.Content, want)
	}
	if u := c.Usage; c.Model != bedrockModel || u == nil || u.CompletionTokens == 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("answer %s: want the route's model and Converse's usage", resp.Body)
	}
	r := checkSigned(t, up, "/model/"+bedrockModelID+"/converse")
	var sent struct {
		Messages        []map[string]any `json:"messages"`
		System          []map[string]any `json:"system"`
		InferenceConfig map[string]any   `json:"inferenceConfig"`
	}
	if err := json.Unmarshal(r.body, &sent); err != nil || len(sent.Messages) != 1 || len(sent.System) != 1 || sent.InferenceConfig["maxTokens"] != float64(64) {
		t.Errorf("upstream body %s: want one message, the system block and maxTokens 64", r.body)
	}
	expectReplayedOnce(t, gw.URL, body, key, resp, up)
}

func TestBedrockStream(t *testing.T) {
	gw, up := startBedrock(t, bedrockSecret)
	const msg, key = "bedrock: one stream", "bedrock-stream"
	body := wireChat(bedrockModel, msg, true)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": key})
	expect(t, resp, http.StatusOK, "created")
	st := chatStreamOf(t, resp.Body)
	if want := referenceWithSystem(t, bedrockModelID, msg); st.Content != want || !st.Done {
		t.Errorf("transcript %q (done %v), want %q", st.Content, st.Done, want)
	}
	if !strings.HasPrefix(st.ID, "chatcmpl-") || !strings.Contains(finishChunk(st.Data), `"finish_reason":"stop"`) || usageChunk(st.Data) <= 0 {
		t.Errorf("stream %q: want chat chunks with an id, a stop finish chunk and the usage chunk asked for", st.Data)
	}
	checkSigned(t, up, "/model/"+bedrockModelID+"/converse-stream")
	// The GenAI client metrics name the provider as the conventions do.
	if n, sum := histogram(t, gw.Metrics(), "gen_ai_client_token_usage", map[string]string{"gen_ai_provider_name": "aws.bedrock",
		"gen_ai_request_model": bedrockModel, "gen_ai_token_type": "output"}); n != 1 || int(sum) != usageChunk(st.Data) {
		t.Errorf("gen_ai_client_token_usage of aws.bedrock: %d samples summing to %g, want 1 of %d", n, sum, usageChunk(st.Data))
	}
	expectReplayedOnce(t, gw.URL, body, key, resp, up)
}

// A ConverseStream that breaks after output is kept with an explicit stream_interrupted
// error (Bedrock cannot continue it) and replayed as it is.
func TestBedrockStreamBreaks(t *testing.T) {
	gw, up := startBedrock(t, bedrockSecret)
	breaksAfterOutput(t, gw.URL, up, wireChat(bedrockModel, "bedrock: a stream that breaks", true), "bedrock-breaks")
}

// A stream that breaks before its first token is sent again: the client gets one whole
// stream, after two backend executions.
func TestBedrockBreakBeforeFirstToken(t *testing.T) {
	gw, up := startBedrock(t, bedrockSecret)
	up.setFaults(map[string]string{"X-Mock-Fault": "drop_start", "X-Mock-Fault-First-N": "1"})
	const msg = "bedrock: broken at the start"
	resp := postChat(t, gw.URL, wireChat(bedrockModel, msg, true), map[string]string{"Idempotency-Key": "bedrock-drop-start"})
	expect(t, resp, http.StatusOK, "created")
	if st := chatStreamOf(t, resp.Body); st.Content != referenceWithSystem(t, bedrockModelID, msg) || !st.Done {
		t.Errorf("transcript %q (done %v)", st.Content, st.Done)
	}
	if n := len(up.requests()); n != 2 {
		t.Errorf("%d upstream requests, want 2 (the one that broke before output, then the answer)", n)
	}
}

// A Bedrock error body reaches the client as an OpenAI one, its exception as the code, stored
// and replayed; so does the mock's in-stream exception, as an error event after the output.
func TestBedrockErrorBody(t *testing.T) {
	gw, up := startBedrock(t, bedrockSecret)
	up.setFaults(map[string]string{"X-Mock-Fault": "error_400"})
	body := wireChat(bedrockModel, "bedrock: refused", false)
	resp := postChat(t, gw.URL, body, map[string]string{"Idempotency-Key": "bedrock-400"})
	expectStatus(t, resp, http.StatusBadRequest)
	assertOpenAIError(t, resp, "ValidationException")
	expectReplayedOnce(t, gw.URL, body, "bedrock-400", resp, up)
	if n, _ := histogram(t, gw.Metrics(), "gen_ai_client_operation_duration_seconds", map[string]string{"gen_ai_provider_name": "aws.bedrock", "error_type": "400"}); n != 1 {
		t.Errorf("gen_ai_client_operation_duration_seconds{error_type=400}: %d samples, want 1", n)
	}

	up.setFaults(map[string]string{"X-Mock-Fault": "error_event_after", "X-Mock-Fault-After": "3"})
	streamed := postChat(t, gw.URL, wireChat(bedrockModel, "bedrock: an exception mid-stream", true), map[string]string{"Idempotency-Key": "bedrock-exception"})
	expect(t, streamed, http.StatusOK, "created")
	st := chatStreamOf(t, streamed.Body)
	if got := tokenFrames(t, st.Data); got != 3 || st.Done || st.ErrCode == "" || !strings.Contains(string(streamed.Body), "mock in-stream error") {
		t.Errorf("stream of %d token frames, error %q (done %v): want 3, then an error event with the backend's message: %q", got, st.ErrCode, st.Done, st.Data)
	}
}

// A request signed with the wrong secret is refused by the backend (403, its signature
// message), which proves the mock checks what the gateway signs.
func TestBedrockBadSignature(t *testing.T) {
	gw, _ := startBedrock(t, "not-the-secret")
	resp := postChat(t, gw.URL, wireChat(bedrockModel, "bedrock: wrong key", false), map[string]string{"Idempotency-Key": "bedrock-403"})
	expectStatus(t, resp, http.StatusForbidden)
	assertOpenAIError(t, resp, "AccessDeniedException")
	if !strings.Contains(string(resp.Body), "signature we calculated does not match") {
		t.Errorf("body %s", resp.Body)
	}
}

// The Responses API reaches a Bedrock backend translated to Chat Completions, streamed or not.
func TestBedrockResponses(t *testing.T) {
	gw, up := startBedrock(t, bedrockSecret)
	for _, stream := range []bool{false, true} {
		r := do(t, http.MethodPost, gw.URL+"/v1/responses", `{"model":"`+bedrockModel+`","input":"bedrock: a response","stream":`+map[bool]string{false: "false", true: "true"}[stream]+`}`,
			map[string]string{"Idempotency-Key": "bedrock-responses-" + map[bool]string{false: "0", true: "1"}[stream]})
		want := `"object":"response"`
		if stream {
			want = "event: response.completed"
		}
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), want) || !strings.Contains(string(r.Body), `"output_text"`) {
			t.Errorf("stream %v: %d %s", stream, r.Status, r.Body)
		}
	}
	// (The gateway runs a Responses request as a stream whatever the client asked.)
	if reqs := up.requests(); len(reqs) != 2 || reqs[0].path != "/model/"+bedrockModelID+"/converse-stream" || reqs[1].path != reqs[0].path {
		t.Errorf("upstream requests %+v, want two ConverseStream calls", reqs)
	}
}
