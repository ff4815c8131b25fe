package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func TestSmoke(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	resp, err := gatewaykit.Client().Post(gw.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"oncegate-mock","messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "chat.completion") {
		t.Fatalf("status %d body %s", resp.StatusCode, b)
	}
	if n := gw.Mock(t, "mock").Stats().Requests; n != 1 {
		t.Fatalf("backend executions = %d, want 1", n)
	}
}
