package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// nodeSDKDir holds the official OpenAI Node SDK (package.json pins it; `npm ci` there installs
// it, as .ci/run does).
const nodeSDKDir = "testdata/node"

// requireNodeSDK returns node's path, or skips (fails with ONCEGATE_REQUIRE_TOOLS=1) when node
// or the installed SDK is missing.
func requireNodeSDK(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeSDKDir, "node_modules", "openai", "package.json"))
	}
	if err != nil {
		if os.Getenv("ONCEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("node and the OpenAI Node SDK are required (ONCEGATE_REQUIRE_TOOLS=1): %v", err)
		}
		t.Skipf("node or the OpenAI Node SDK missing (cd e2e/%s && npm ci; set ONCEGATE_REQUIRE_TOOLS=1 to make this a failure): %v", nodeSDKDir, err)
	}
	return node
}

// runNodeScript runs script of testdata/node with env added (within 90 s) and decodes the
// JSON it prints into out.
func runNodeScript(t *testing.T, node, script string, out any, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = nodeSDKDir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		t.Fatalf("node %s output %q: %v", script, stdout, err)
	}
}

// nodeResults is what testdata/node/responses.mjs prints.
type nodeResults struct {
	Create struct{ ID, Status, Text string }
	Stream struct {
		Types []string
		Text  string
		SeqOK bool
	}
	Background struct{ First, Last, Text, ID string }
	Resume     struct {
		Seqs         []int
		Text         string
		HelperSeqs   []int
		HelperText   string
		HelperStatus string
	}
	Cancel     struct{ Status, Retrieved string }
	Previous   struct{ Text, Previous string }
	BadRequest struct {
		Error, Code, Param string
		Status             int
	}
	Embeddings struct {
		Count, Dims, Prompt int
		Same                bool
	}
}

// TestNodeSDKResponses drives the Responses API with the official OpenAI Node SDK (npm openai,
// unchanged): create, stream, background then retrieve until completed, a stream cut and
// resumed with retrieve(id, {stream, starting_after}) and with the SDK's responses.stream()
// helper (which rebuilds the whole response), cancel, previous_response_id, and a 400 the
// SDK raises as its BadRequestError, and embeddings.create twice (one execution). Each intent
// executes once at the mock.
func TestNodeSDKResponses(t *testing.T) {
	node := requireNodeSDK(t)
	gw := gatewaykit.StartGateway(t, nil)
	mock := gw.Mock(t, "mock")
	tag := fmt.Sprint(time.Now().UnixNano())
	before := mock.Stats().Requests
	var got nodeResults
	runNodeScript(t, node, "responses.mjs", &got, "ONCEGATE_BASE="+gw.URL, "ONCEGATE_MODEL="+config.MockModel, "ONCEGATE_TAG="+tag)
	want := func(input string) string { return mockContent(t, input+" "+tag) }

	if got.Create.Status != "completed" || got.Create.Text != want("node create") || !strings.HasPrefix(got.Create.ID, "resp_") {
		t.Errorf("create: %+v, want completed %q", got.Create, want("node create"))
	}
	if !got.Stream.SeqOK || got.Stream.Text != want("node stream") || len(got.Stream.Types) != 24 ||
		got.Stream.Types[0] != "response.created" || got.Stream.Types[23] != "response.completed" {
		t.Errorf("stream: %+v", got.Stream)
	}
	if (got.Background.First != "queued" && got.Background.First != "in_progress") || got.Background.Last != "completed" ||
		got.Background.Text != want("node background") {
		t.Errorf("background: %+v", got.Background)
	}
	all := make([]int, 24)
	for i := range all {
		all[i] = i
	}
	if !slices.Equal(got.Resume.Seqs, all) || got.Resume.Text != want("node resume") {
		t.Errorf("cut at 6 and resumed: sequence numbers %v (want 0..23 once each), text %q", got.Resume.Seqs, got.Resume.Text)
	}
	if !slices.Equal(got.Resume.HelperSeqs, all[7:]) || got.Resume.HelperText != want("node resume") || got.Resume.HelperStatus != "completed" {
		t.Errorf("responses.stream() resumed after 6: %v %q %q", got.Resume.HelperSeqs, got.Resume.HelperText, got.Resume.HelperStatus)
	}
	if got.Cancel.Status != "cancelled" || got.Cancel.Retrieved != "cancelled" {
		t.Errorf("cancel: %+v", got.Cancel)
	}
	if got.Previous.Previous != got.Create.ID || got.Previous.Text == "" || got.Previous.Text == want("node turn two") {
		// The mock's answer depends on the whole conversation: a continuation answers otherwise
		// than the same input alone.
		t.Errorf("previous_response_id: %+v", got.Previous)
	}
	if got.BadRequest.Error != "BadRequestError" || got.BadRequest.Status != 400 || got.BadRequest.Code != "unsupported_parameter" {
		t.Errorf("bad request: %+v", got.BadRequest)
	}
	if e := got.Embeddings; e.Count != 2 || !e.Same || e.Dims == 0 || e.Prompt == 0 {
		t.Errorf("embeddings: %+v, want 2 vectors, the same both times", e)
	}
	// create, stream, background, resume, previous, embeddings: one execution each (the second
	// embeddings call is a replay); the cancelled one ran at most once; the 400 none.
	if n := mock.Stats().Requests - before; n < 6 || n > 7 {
		t.Errorf("backend executions = %d, want 6 (7 if the cancelled one had started)", n)
	}
}
