package main

import (
	"math"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRatio is the share of the container's memory limit the Go runtime aims to stay
// under: the rest is for what the runtime does not count (the embedded server's mapped files,
// thread stacks) and the moment before the collector catches up.
const memoryLimitRatio = 0.9

// setMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to memoryLimitRatio of
// the limit provider reports (memlimit.FromCgroup: the container's cgroup limit), with
// automemlimit. Without it the collector lets the heap grow to twice what is live, and a
// gateway under load in a container near its limit is killed for memory before it collects
// (BENCHMARKS.md: GOMEMLIMIT held RSS at the limit for 8-22 % more CPU). A GOMEMLIMIT set by
// the operator wins, and AUTOMEMLIMIT=off (or a ratio) is automemlimit's own switch. It runs
// in main, once for the process, never in the tests that call run: the limit is the
// process's.
func setMemoryLimit(provider memlimit.Provider) error {
	_, err := memlimit.Set(memlimit.WithProvider(provider), memlimit.WithRatio(memoryLimitRatio))
	return err
}

// memoryLimit is the Go runtime's soft memory limit in effect (0: none) and where it came
// from, for serve's start line: "GOMEMLIMIT" (the operator's), "off" (AUTOMEMLIMIT=off),
// "cgroup" (setMemoryLimit's, from the container's limit) or "none".
func memoryLimit(getenv func(string) string) (limit int64, source string) {
	limit = debug.SetMemoryLimit(-1)
	switch {
	case getenv("GOMEMLIMIT") != "":
		return limit, "GOMEMLIMIT"
	case getenv("AUTOMEMLIMIT") == "off":
		return 0, "off"
	case limit == math.MaxInt64:
		return 0, "none"
	}
	return limit, "cgroup"
}
