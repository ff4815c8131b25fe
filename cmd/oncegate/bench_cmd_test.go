package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/mockllm"
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
