package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func keyHash(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := keyMain(append([]string{"hash"}, args...), strings.NewReader(stdin), &out, &errOut); code != 0 {
		t.Fatalf("key hash %v: exit %d, %s", args, code, errOut.String())
	}
	return strings.TrimSuffix(out.String(), "\n")
}

// TestKeyHashAuthenticates: the hash `oncegate key hash` prints, from an argument or from
// stdin (with echo's newline), is what the gateway compares: a tenant configured with it is
// served with the key, as Bearer or x-api-key, and an admin key configured with it opens the
// admin API.
func TestKeyHashAuthenticates(t *testing.T) {
	tenantHash := keyHash(t, "", "sk-acme-1")
	if got := keyHash(t, "sk-acme-1\n"); got != tenantHash {
		t.Fatalf("stdin %s, argument %s: want the same hash", got, tenantHash)
	}
	adminHash := keyHash(t, "  sk-admin\r\n")
	cfg := gatewaykit.Config(t)
	cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{tenantHash}}}
	cfg.Admin.APIKeysSHA256 = []string{adminHash}
	gw := gatewaykit.StartGateway(t, cfg)

	c := gatewaykit.Client()
	send := func(method, path, body string, hdr ...string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, gw.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	chat := `{"model":"oncegate-mock","messages":[{"role":"user","content":"key hash"}]}`
	tests := []struct {
		name, method, path, body string
		hdr                      []string
		want                     int
	}{
		{"tenant, Bearer", http.MethodPost, "/v1/chat/completions", chat, []string{"Authorization", "Bearer sk-acme-1"}, http.StatusOK},
		{"tenant, x-api-key", http.MethodPost, "/v1/chat/completions", chat, []string{"x-api-key", "sk-acme-1"}, http.StatusOK},
		{"tenant, another key", http.MethodPost, "/v1/chat/completions", chat, []string{"Authorization", "Bearer sk-acme-2"}, http.StatusUnauthorized},
		{"admin", http.MethodGet, "/v1/admin/bill?tenant=acme", "", []string{"Authorization", "Bearer sk-admin"}, http.StatusOK},
		{"admin, the tenant's key", http.MethodGet, "/v1/admin/bill?tenant=acme", "", []string{"Authorization", "Bearer sk-acme-1"}, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := send(tt.method, tt.path, tt.body, tt.hdr...); got != tt.want {
				t.Errorf("status %d, want %d", got, tt.want)
			}
		})
	}
}

func TestKeyHashRefusals(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		stdin string
		want  string
	}{
		{"no subcommand", nil, "", "usage"},
		{"unknown subcommand", []string{"new"}, "", "usage"},
		{"empty stdin", []string{"hash"}, "\n", "empty"},
		{"two lines", []string{"hash"}, "sk-a\nsk-b\n", "line break"},
		{"too much", []string{"hash"}, strings.Repeat("k", maxKeyBytes+1), "more than"},
		{"two arguments", []string{"hash", "a", "b"}, "", "usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := keyMain(tt.args, strings.NewReader(tt.stdin), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tt.want) || out.Len() != 0 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 mentioning %q", code, out.String(), errOut.String(), tt.want)
			}
		})
	}
}
