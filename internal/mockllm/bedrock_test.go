package mockllm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// signedBedrock is a Converse request to srv signed with secret.
func signedBedrock(t *testing.T, url, secret, body string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	sum := sha256.Sum256([]byte(body))
	if err := v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: "AKID", SecretAccessKey: secret}, r,
		hex.EncodeToString(sum[:]), "bedrock", "us-east-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestBedrockWire: the mock refuses an unsigned or wrongly signed request as Bedrock does
// (403, {"__type","message"}), answers a signed Converse request with the chat mock's text and
// usage, and ConverseStream with an event stream the SDK's decoder reads, ending in metadata.
func TestBedrockWire(t *testing.T) {
	srv := httptest.NewServer(New(Options{Models: []string{"oncegate-mock"}, AWSSecretKey: "s3cret"}))
	defer srv.Close()
	const body = `{"messages":[{"role":"user","content":[{"text":"hello"}]}]}`
	do := func(r *http.Request) (*http.Response, []byte) {
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp, b.Bytes()
	}
	unsigned, _ := http.NewRequest(http.MethodPost, srv.URL+"/model/oncegate-mock/converse", strings.NewReader(body))
	for name, r := range map[string]*http.Request{"unsigned": unsigned, "wrong secret": signedBedrock(t, srv.URL+"/model/oncegate-mock/converse", "other", body)} {
		if resp, b := do(r); resp.StatusCode != http.StatusForbidden || !bytes.Contains(b, []byte(`"__type":"AccessDeniedException"`)) {
			t.Errorf("%s: %d %s, want 403 AccessDeniedException", name, resp.StatusCode, b)
		}
	}
	resp, b := do(signedBedrock(t, srv.URL+"/model/oncegate-mock/converse", "s3cret", body))
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"stopReason":"end_turn"`)) || !bytes.Contains(b, []byte(`"outputTokens":16`)) {
		t.Fatalf("converse: %d %s", resp.StatusCode, b)
	}
	resp, b = do(signedBedrock(t, srv.URL+"/model/oncegate-mock/converse-stream", "s3cret", body))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/vnd.amazon.eventstream" {
		t.Fatalf("converse-stream: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	dec, rd := eventstream.NewDecoder(), bytes.NewReader(b)
	var events []string
	for rd.Len() > 0 {
		m, err := dec.Decode(rd, nil)
		if err != nil {
			t.Fatalf("event %d: %v", len(events), err)
		}
		events = append(events, m.Headers.Get(":event-type").String())
	}
	if len(events) != 16+5 || events[0] != "messageStart" || events[2] != "contentBlockDelta" || events[len(events)-2] != "messageStop" || events[len(events)-1] != "metadata" {
		t.Fatalf("events %v", events)
	}
}
