// Command oncegate is the exactly-once gateway for LLM APIs: `oncegate serve` (the default)
// runs the gateway, `oncegate mock` the standalone mock model backend, `oncegate config
// check` validates a configuration file, `oncegate healthcheck` asks a gateway whether it is
// ready (the container image's health check) and `oncegate version` says what was built.
// `oncegate --help` lists every command. This package is wiring only.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func main() {
	// The process's memory limit from its container's (serve's start line says which limit
	// is in effect; a cgroup that cannot be read leaves none).
	_ = setMemoryLimit(memlimit.FromCgroup)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

const usage = `usage: oncegate [COMMAND] [FLAGS]

commands:
  serve        the gateway (the default command): HTTP API, workers, embedded or external NATS
  mock         the deterministic OpenAI-compatible and Anthropic mock backend
  config       config check FILE: validate a configuration, every problem at once
  key          key hash [KEY]: the sha256 hex for api_keys_sha256 (reads stdin without KEY);
               key add --tenant T | revoke HASH|KEY|- | list [--url URL]: run-time keys (see key add -h)
  ledger       ledger verify|head|export|bill|reconcile: the billing ledger's tools
  bench        load tool for any OpenAI-compatible URL
  healthcheck  GET a gateway's /readyz: exit 0 when ready, 1 otherwise (container health checks)
  version      the build's module version, VCS revision and Go version
  help         this list

"oncegate COMMAND -h" lists a command's flags. The gateway's:
  oncegate [serve] [--listen ADDR] [--data-dir DIR] [--config FILE] [--role all|api|worker]
                   [--nats-url URL[,URL...]] [--nats-listen ADDR] [--metrics-listen ADDR] [--dashboard-public]
                   [--nats-cluster NAME --nats-cluster-listen ADDR --nats-routes URL,URL,... [--nats-server-name NAME]]
                   [--nats-partitions N [--nats-place-partitions --nats-tags og-pK]]
`

// run dispatches a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		cmd = "help" // the command list, not serve's flags
	} else if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serveMain(ctx, args, stderr, getenv, nil)
	case "mock":
		return mockMain(ctx, args, stdout, stderr)
	case "config":
		return configMain(args, stdout, stderr, getenv)
	case "bench":
		return benchMain(ctx, args, stdout, stderr)
	case "ledger":
		return ledgerMain(ctx, args, stdout, stderr, getenv)
	case "key":
		if len(args) > 0 && isKeyAdminCommand(args[0]) {
			return keyAdminMain(ctx, args, os.Stdin, stdout, stderr, getenv)
		}
		return keyMain(args, os.Stdin, stdout, stderr)
	case "healthcheck":
		return healthcheckMain(ctx, args, stdout, stderr, getenv)
	case "version":
		return versionMain(args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "oncegate: unknown command %q\n%s", cmd, usage)
	return 2
}
