package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func TestSmoke(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	r := postChat(t, gw.URL, `{"model":"oncegate-mock","messages":[{"role":"user","content":"hello"}]}`, nil)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "chat.completion") {
		t.Fatalf("status %d body %s", r.Status, r.Body)
	}
	if n := gw.Mock(t, "mock").Stats().Requests; n != 1 {
		t.Fatalf("backend executions = %d, want 1", n)
	}
}
