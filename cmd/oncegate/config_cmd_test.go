package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheckListsEveryProblem: `config check` on a file with an unknown field, wrong
// types and rule violations prints every one of them with its line and YAML path (the
// misspelled field with the name it was meant to be), then the count, and exits 1.
func TestConfigCheckListsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	yaml := "listen: 127.0.0.1:8080\n" +
		"idempotency:\n" +
		"  auto_windw: 3s\n" +
		"  ttl: forever\n" +
		"  lease: 1s\n" +
		"  renew_every: 300ms\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"config", "check", path}, &stdout, &stderr, func(string) string { return "" }); code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr.String())
	}
	want := path + ":3: idempotency.auto_windw: unknown field (did you mean auto_window?)\n" +
		path + ":4: idempotency.ttl: cannot use !!str `forever` as a duration (want a Go duration string like \"3s\" or \"150ms\")\n" +
		path + ":5: idempotency.lease: must be at least 2s, got 1s\n" +
		path + ": 3 error(s)\n"
	if got := stderr.String(); got != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(stderr.String(), "config.Idempotency") {
		t.Error("the message names a Go type")
	}
}
