package lb_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/testkit/lb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRoundRobinSkipsRefusingBackends: requests go to the backends in turn; a backend that
// refuses connections (a dead process) is skipped, not answered for; with every backend
// refusing, the client's connection is closed.
func TestRoundRobinSkipsRefusingBackends(t *testing.T) {
	var names []string
	var servers []*httptest.Server
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) }))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
		names = append(names, strings.TrimPrefix(srv.URL, "http://"))
	}
	b := lb.Start(t, names...)
	get := func() (string, error) {
		tr := &http.Transport{DisableKeepAlives: true} // one connection per request: each is balanced
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(b.URL())
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	seen := map[string]int{}
	for range 6 {
		who, err := get()
		if err != nil {
			t.Fatal(err)
		}
		seen[who]++
	}
	if seen["n1"] != 2 || seen["n2"] != 2 || seen["n3"] != 2 {
		t.Fatalf("answers by backend %v, want 2 each (round robin)", seen)
	}

	servers[1].Close() // n2 dies: its port refuses
	seen = map[string]int{}
	for range 6 {
		who, err := get()
		if err != nil {
			t.Fatalf("with n2 dead: %v", err)
		}
		seen[who]++
	}
	if seen["n2"] != 0 || seen["n1"]+seen["n3"] != 6 || b.Refused.Load() == 0 {
		t.Fatalf("answers by backend %v, %d refusals; want n1 and n3 only, n2's refusals retried", seen, b.Refused.Load())
	}

	servers[0].Close()
	servers[2].Close()
	if _, err := get(); err == nil {
		t.Fatal("answered with every backend dead")
	}
	if b.Dropped.Load() == 0 {
		t.Fatal("no client connection dropped with every backend dead")
	}
}
