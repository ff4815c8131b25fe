package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/bench"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func TestBenchJSON(t *testing.T) {
	srv := httptest.NewServer(mockllm.New(mockllm.Options{}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"bench", "--url", srv.URL, "--scenario", "overhead", "--duration", "300ms", "--json"},
		&out, &errOut, os.Getenv)
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, errOut.String())
	}
	var rep struct {
		Scenario string `json:"scenario"`
		Targets  []struct {
			Requests  int64 `json:"requests"`
			Successes int64 `json:"successes"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	if rep.Scenario != "overhead" || len(rep.Targets) != 1 || rep.Targets[0].Requests == 0 {
		t.Fatalf("report %+v: want one target with requests > 0\n%s", rep, out.String())
	}
}

func TestBenchRefusals(t *testing.T) {
	srv := httptest.NewServer(mockllm.New(mockllm.Options{}))
	defer srv.Close()
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"remote target", []string{"--url", "http://10.0.0.1:8080"}, 1, "--allow-remote"},
		{"long run", []string{"--url", srv.URL, "--duration", "11m"}, 1, "--allow-long"},
		{"bad scenario", []string{"--url", srv.URL, "--scenario", "chaos"}, 1, "--scenario"},
		{"bad flag", []string{"--no-such-flag"}, 2, "flag provided but not defined"},
		{"bad mock-itl", []string{"--mock-itl", "soon"}, 2, "milliseconds"},
		{"stray argument", []string{"--url", srv.URL, "extra"}, 2, "unexpected argument"},
		{"header without colon", []string{"--url", srv.URL, "--header", "Authorization Bearer x"}, 2, "want 'Name: value'"},
		{"header name with a space", []string{"--url", srv.URL, "--header", "X Tenant: a"}, 2, "not an HTTP field name"},
		{"header value with a newline", []string{"--url", srv.URL, "--header", "X-Tenant: a\r\nX-Evil: 1"}, 2, "control character"},
		{"header the tool sets", []string{"--url", srv.URL, "--header", "Idempotency-Key: k"}, 2, "set by oncegate bench itself"},
		{"api key and an Authorization header", []string{"--url", srv.URL, "--api-key", "sk-a", "--header", "Authorization: Bearer sk-b"}, 2, "give one"},
		{"api key with a space", []string{"--url", srv.URL, "--api-key", "sk a"}, 2, "--api-key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"bench"}, tt.args...), &out, &errOut, os.Getenv)
			if code != tt.code || !strings.Contains(errOut.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut.String(), tt.code, tt.want)
			}
			if out.Len() != 0 {
				t.Errorf("stdout not empty: %s", out.String())
			}
		})
	}
}

func TestMsDurationFlag(t *testing.T) {
	for in, want := range map[string]string{"5": "5ms", "250ms": "250ms", "1s": "1s", "0": "0s"} {
		var d msDuration
		if err := d.Set(in); err != nil || d.String() != want {
			t.Errorf("Set(%q) = %s, %v; want %s", in, d.String(), err, want)
		}
	}
}

// TestBenchAuthenticates: against a gateway with tenants, bench without a key gets only 401s;
// with --api-key (sent as Authorization: Bearer) or the same credentials as --header, every
// request succeeds.
func TestBenchAuthenticates(t *testing.T) {
	cfg := gatewaykit.Config(t)
	sum := sha256.Sum256([]byte("sk-bench"))
	cfg.Tenants = []config.Tenant{{ID: "acme", APIKeysSHA256: []string{hex.EncodeToString(sum[:])}}}
	gw := gatewaykit.StartGateway(t, cfg)
	tests := []struct {
		name string
		args []string
		ok   bool
	}{
		{"no key", nil, false},
		{"wrong key", []string{"--api-key", "sk-other"}, false},
		{"--api-key", []string{"--api-key", "sk-bench"}, true},
		{"--header Authorization", []string{"--header", "Authorization: Bearer sk-bench"}, true},
		{"--header x-api-key, repeated", []string{"--header", "x-api-key: sk-bench", "--header", "X-Trace: bench"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"bench", "--url", gw.URL, "--duration", "1s", "--warmup", "0", "--max-requests", "8",
				"--concurrency", "2", "--json"}, tt.args...)
			code := run(t.Context(), args, &out, &errOut, os.Getenv)
			if code != 0 {
				t.Fatalf("exit %d, stderr: %s", code, errOut.String())
			}
			var rep struct {
				Targets []struct {
					Requests     int64             `json:"requests"`
					Successes    int64             `json:"successes"`
					Errors       map[string]int64  `json:"errors"`
					ErrorSamples map[string]string `json:"error_samples"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Targets) != 1 {
				t.Fatalf("report: %v\n%s", err, out.String())
			}
			r := rep.Targets[0]
			if r.Requests == 0 {
				t.Fatalf("no requests: %s", out.String())
			}
			if tt.ok && (r.Successes != r.Requests || len(r.Errors) != 0) {
				t.Fatalf("%d of %d succeeded, errors %v %v; want all", r.Successes, r.Requests, r.Errors, r.ErrorSamples)
			}
			if !tt.ok {
				if r.Successes != 0 || r.Errors[string(bench.KindHTTP4xx)] != r.Requests {
					t.Fatalf("%d of %d succeeded, errors %v; want every request refused", r.Successes, r.Requests, r.Errors)
				}
				if s := r.ErrorSamples[string(bench.KindHTTP4xx)]; !strings.Contains(s, "401") {
					t.Errorf("error sample %q: want a 401", s)
				}
			}
		})
	}
}
