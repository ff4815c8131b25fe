package main

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestVersionText: what `oncegate version` prints for the build information a `go install
// …@version`, a build in a git checkout (clean or modified) and a build without information
// record.
func TestVersionText(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"go install of a tagged version", &debug.BuildInfo{Main: debug.Module{Path: "github.com/oncegate/oncegate", Version: "v1.2.3"}},
			"oncegate v1.2.3\ngo: go1.26.8 linux/amd64\n"},
		{"git checkout, clean", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "04198f57b5c31ef92e5e68cd2da5fe6915765918"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "false"}}},
			"oncegate (devel)\nrevision: 04198f57b5c31ef92e5e68cd2da5fe6915765918\ntime: 2026-01-02T03:04:05Z\ngo: go1.26.8 linux/amd64\n"},
		{"git checkout, modified", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260102030405-04198f57b5c3+dirty"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "04198f57b5c3"}, {Key: "vcs.modified", Value: "true"}}},
			"oncegate v0.0.0-20260102030405-04198f57b5c3+dirty\nrevision: 04198f57b5c3 (modified)\ngo: go1.26.8 linux/amd64\n"},
		{"no build information", nil, "oncegate unknown\ngo: go1.26.8 linux/amd64\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionText(tc.bi, "go1.26.8", "linux/amd64"); got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestVersionCommand: `oncegate version` exits 0 and ends with this binary's Go version and
// platform; an argument is refused with exit 2.
func TestVersionCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"version"}, &stdout, &stderr, func(string) string { return "" }); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "go: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if out := stdout.String(); !strings.HasPrefix(out, "oncegate ") || !strings.HasSuffix(out, want) {
		t.Errorf("stdout %q, want \"oncegate …\" and last line %q", out, want)
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"version", "--short"}, &stdout, &stderr, func(string) string { return "" }); code != 2 || stdout.Len() != 0 {
		t.Errorf("version --short: exit %d, stdout %q, want exit 2 and nothing on stdout", code, stdout.String())
	}
}

// TestHelpListsCommands: `oncegate --help`, `-h` and `help` print the command list
// (testdata/help.txt) and exit 0, instead of serve's flags; every command dispatched by run
// is on it; an unknown command gets the list on stderr and exit 2. `serve -h` prints serve's
// flags (testdata/serve-help.txt).
func TestHelpListsCommands(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "-help", "help"} {
		t.Run(arg, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{arg}, &stdout, &stderr, func(string) string { return "" }); code != 0 || stderr.Len() != 0 {
				t.Fatalf("exit %d, stderr %q", code, stderr.String())
			}
			testkit.Golden(t, "testdata/help.txt", stdout.Bytes())
		})
	}
	for _, cmd := range []string{"serve", "mock", "config", "key", "ledger", "bench", "healthcheck", "version", "help"} {
		if !strings.Contains(usage, "\n  "+cmd+" ") {
			t.Errorf("the command list has no line for %q", cmd)
		}
		// Every listed command is dispatched: `CMD -h` is never "unknown command".
		var stdout, stderr bytes.Buffer
		run(context.Background(), []string{cmd, "-h"}, &stdout, &stderr, func(string) string { return "" })
		if strings.Contains(stderr.String(), "unknown command") {
			t.Errorf("%s -h: %s", cmd, stderr.String())
		}
	}
	// serve's flags: deploy/kubernetes's test checks the manifests' flags against this file.
	var serveOut, serveErr bytes.Buffer
	if code := run(context.Background(), []string{"serve", "-h"}, &serveOut, &serveErr, func(string) string { return "" }); code != 2 || serveOut.Len() != 0 {
		t.Errorf("serve -h: exit %d, stdout %q", code, serveOut.String())
	}
	testkit.Golden(t, "testdata/serve-help.txt", serveErr.Bytes())
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"frobnicate"}, &stdout, &stderr, func(string) string { return "" }); code != 2 ||
		!strings.HasPrefix(stderr.String(), "oncegate: unknown command \"frobnicate\"\n"+usage[:20]) {
		t.Errorf("unknown command: exit %d, stderr %q", code, stderr.String())
	}
}
