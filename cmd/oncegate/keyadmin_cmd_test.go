package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// keyAdmin runs `oncegate key ARGS` through run, with env; it returns the exit code and outputs.
func keyAdmin(env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), append([]string{"key"}, args...), &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

// TestKeyAdminBadArgs: a wrong command line is a clear one-line error, the usage, exit 2, and
// nothing is sent (the URL is a port nothing listens on).
func TestKeyAdminBadArgs(t *testing.T) {
	env := map[string]string{"ONCEGATE_ADMIN_KEY": "sk-admin", "ONCEGATE_URL": "http://127.0.0.1:1"}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"add without --tenant", env, []string{"add"}, "give --tenant TENANT"},
		{"add with an argument", env, []string{"add", "--tenant", "acme", "extra"}, "give --tenant TENANT and nothing else"},
		{"add with an unknown flag", env, []string{"add", "--tenant", "acme", "--force"}, "flag provided but not defined: -force"},
		{"revoke without a key", env, []string{"revoke"}, "give one key hash, key, or -"},
		{"revoke with two keys", env, []string{"revoke", "a", "b"}, "give one key hash, key, or -"},
		{"revoke an empty key", env, []string{"revoke", "  "}, "the key is empty"},
		{"list with an argument", env, []string{"list", "all"}, "list takes no arguments"},
		{"no admin key", map[string]string{}, []string{"list"}, "set ONCEGATE_ADMIN_KEY"},
		{"a URL that is not http", env, []string{"list", "--url", "nats://127.0.0.1:4222"}, `--url "nats://127.0.0.1:4222" is not an http(s) URL`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := keyAdmin(tc.env, tc.args...)
			if code != 2 || out != "" || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "usage: oncegate key add") {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2, nothing on stdout, %q and the usage", code, out, errOut, tc.want)
			}
		})
	}
	if code, out, _ := keyAdmin(env, "add", "-h"); code != 0 || !strings.Contains(out, "usage: oncegate key add") {
		t.Errorf("add -h: exit %d, %q; want 0 and the usage", code, out)
	}
}

// TestKeyAdminCommands: against a running gateway, `key add` prints a new key once, which
// then authenticates as its tenant; `key list` shows its hash (never the key); `key revoke`
// with the key on stdin refuses it (401); a gateway error (an unknown tenant) is exit 1 with
// the gateway's message.
func TestKeyAdminCommands(t *testing.T) {
	const admin = "sk-admin-cli"
	sum := sha256.Sum256([]byte(admin))
	cfg := gatewaykit.Config(t)
	cfg.Tenants = []config.Tenant{{ID: "acme"}}
	cfg.Admin.APIKeysSHA256 = []string{hex.EncodeToString(sum[:])}
	gw := gatewaykit.StartGateway(t, cfg)
	env := map[string]string{"ONCEGATE_ADMIN_KEY": admin}

	code, out, errOut := keyAdmin(env, "add", "--tenant", "acme", "--url", gw.URL)
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "og-") || strings.Count(out, "\n") != 1 {
		t.Fatalf("add: exit %d, stdout %q, stderr %q; want 0 and one key", code, out, errOut)
	}
	keySum := sha256.Sum256([]byte(key))
	hash := hex.EncodeToString(keySum[:])
	if !strings.Contains(errOut, hash) {
		t.Errorf("add's note %q does not name the stored hash %s", errOut, hash)
	}
	chat := func() int {
		req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"oncegate-mock","messages":[{"role":"user","content":"cli key"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := gatewaykit.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := chat(); got != http.StatusOK {
		t.Fatalf("the added key: %d, want 200", got)
	}
	code, out, errOut = keyAdmin(env, "list", "--url", gw.URL)
	if code != 0 || !strings.Contains(out, hash) || !strings.Contains(out, "acme") || strings.Contains(out, key) {
		t.Errorf("list: exit %d, %q (%s); want the hash and tenant, never the key", code, out, errOut)
	}
	code, out, errOut = runWithStdin(env, key+"\n", "revoke", "--url", gw.URL, "-")
	if code != 0 || !strings.Contains(out, "revoked "+hash) {
		t.Fatalf("revoke -: exit %d, %q %q", code, out, errOut)
	}
	if got := chat(); got != http.StatusUnauthorized {
		t.Errorf("the revoked key: %d, want 401", got)
	}
	code, _, errOut = keyAdmin(env, "add", "--tenant", "nobody", "--url", gw.URL)
	if code != 1 || !strings.Contains(errOut, "no configured tenant has this id") {
		t.Errorf("add for an unknown tenant: exit %d, %q; want 1 and the gateway's message", code, errOut)
	}
}

// runWithStdin is keyAdminMain with stdin (run reads the process's own).
func runWithStdin(env map[string]string, stdin string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = keyAdminMain(context.Background(), args, strings.NewReader(stdin), &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}
