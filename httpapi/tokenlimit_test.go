package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestHugeTokenLimit: a token limit of 5,000 digits (beyond float64, which the fingerprint
// refuses) gets the answer one of 20 digits (beyond the limit, within float64) gets, byte for
// byte: the same status, code and message, naming the parameter, on every API that checks
// one (before, it was invalid_json with param null). Any other number beyond float64 stays
// invalid_json and names its member.
func TestHugeTokenLimit(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	post := func(t *testing.T, path, body string) (int, []byte) {
		t.Helper()
		resp, err := openPost(gw, path, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	const (
		chat      = `{"model":"oncegate-mock","messages":[{"role":"user","content":"hi"}],`
		responses = `{"model":"oncegate-mock","input":"hi",`
	)
	twenty, fiveThousand := strings.Repeat("9", 20), strings.Repeat("9", 5000)
	for _, tc := range []struct {
		name, path, prefix, param string
		sign                      string // "-": the numbers are negative
	}{
		{name: "chat max_tokens", path: "/v1/chat/completions", prefix: chat, param: "max_tokens"},
		{name: "chat max_tokens negative", path: "/v1/chat/completions", prefix: chat, param: "max_tokens", sign: "-"},
		{name: "chat max_completion_tokens", path: "/v1/chat/completions", prefix: chat, param: "max_completion_tokens"},
		{name: "messages max_tokens", path: "/v1/messages", prefix: chat, param: "max_tokens"},
		{name: "responses max_output_tokens", path: "/v1/responses", prefix: responses, param: "max_output_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := func(digits string) string { return tc.prefix + `"` + tc.param + `":` + tc.sign + digits + `}` }
			wantStatus, want := post(t, tc.path, body(twenty))
			if wantStatus != http.StatusBadRequest || !strings.Contains(string(want), tc.param) {
				t.Fatalf("20 digits: %d %s, want 400 naming %s", wantStatus, want, tc.param)
			}
			status, got := post(t, tc.path, body(fiveThousand))
			if status != wantStatus || string(got) != string(want) {
				t.Errorf("5,000 digits: %d %s\nwant what 20 digits get: %d %s", status, got, wantStatus, want)
			}
		})
	}
	t.Run("another number beyond float64", func(t *testing.T) {
		status, b := post(t, "/v1/chat/completions", chat+`"temperature":1e999}`)
		var e struct {
			Error struct {
				Code  string  `json:"code"`
				Param *string `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil || status != http.StatusBadRequest || e.Error.Code != "invalid_json" ||
			e.Error.Param == nil || *e.Error.Param != "temperature" {
			t.Errorf("%d %s, want 400 invalid_json naming temperature", status, b)
		}
	})
}
