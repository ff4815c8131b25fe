package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// buildVersion names a build that has no module version or VCS information to read: the
// container image sets it with -ldflags "-X main.buildVersion=…" (its build context has no
// .git). It is written by the linker only, never at run time.
var buildVersion string

// versionMain is `oncegate version`: what was built, from the build information the Go
// toolchain embeds (the module version of `go install …@vX`, the VCS revision of a build in a
// git checkout) and the Go version that built it.
func versionMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" {
			fmt.Fprintln(stdout, "usage: oncegate version\n  prints the module version, VCS revision and time, and the Go version of this build")
			return 0
		}
		fmt.Fprintf(stderr, "oncegate version: unexpected argument %q\n", args[0])
		return 2
	}
	bi, _ := debug.ReadBuildInfo() // nil without build information: versionText says so
	if bi != nil && buildVersion != "" {
		bi.Main.Version = buildVersion
	}
	io.WriteString(stdout, versionText(bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH))
	return 0
}

// versionText renders the build information bi: one "name: value" line each for the module
// version, the VCS revision (with "(modified)" for a dirty tree) and commit time when the
// build recorded them, the Go version and the platform.
func versionText(bi *debug.BuildInfo, goVersion, platform string) string {
	version := "unknown"
	settings := map[string]string{}
	if bi != nil {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "oncegate %s\n", version)
	if rev := settings["vcs.revision"]; rev != "" {
		if settings["vcs.modified"] == "true" {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "revision: %s\n", rev)
	}
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(&b, "time: %s\n", t)
	}
	fmt.Fprintf(&b, "go: %s %s\n", goVersion, platform)
	return b.String()
}
