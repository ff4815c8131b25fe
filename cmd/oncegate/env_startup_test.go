package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestServeOpenAIBaseURLWithoutKey: `oncegate serve` with OPENAI_BASE_URL and no
// OPENAI_API_KEY exits 1 with one line naming the missing variable, before it binds a port
// or creates its data dir.
func TestServeOpenAIBaseURLWithoutKey(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	addr := busyAddr(t) // taken: a start that got as far as listening would fail differently
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := oncegateCmd(ctx, t, "serve", "--listen", addr, "--data-dir", dataDir)
	cmd.Env = append(cmd.Env, "OPENAI_BASE_URL=https://api.openai.com/v1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	const want = "oncegate: config: incomplete environment: OPENAI_BASE_URL is set but OPENAI_API_KEY is not: " +
		"set OPENAI_API_KEY too (the backend at OPENAI_BASE_URL needs its key), or unset OPENAI_BASE_URL\n"
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || stderr.String() != want {
		t.Errorf("exit %v, stderr:\n%s\nwant exit 1 and the one line:\n%s", err, stderr.String(), want)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists after the refused start (%v)", dataDir, err)
	}
}
