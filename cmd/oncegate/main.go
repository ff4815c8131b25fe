// Command oncegate is the exactly-once gateway for LLM APIs: `oncegate serve` (the default)
// runs the gateway, `oncegate mock` the standalone mock model backend, and `oncegate config
// check` validates a configuration file. This package is wiring only.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

const usage = `usage:
  oncegate [serve] [--listen ADDR] [--data-dir DIR] [--config FILE] [--role all|api|worker]
                   [--nats-url URL[,URL...]] [--nats-listen ADDR] [--metrics-listen ADDR] [--dashboard-public]
                   [--nats-cluster NAME --nats-cluster-listen ADDR --nats-routes URL,URL,... [--nats-server-name NAME]]
  oncegate mock [--listen ADDR] [--ttft DUR] [--inter-token DUR] [--tokens N]
  oncegate config check FILE
  oncegate key hash [KEY]      (the sha256 hex for api_keys_sha256; reads stdin without KEY)
  oncegate key add --tenant T | revoke HASH|KEY|- | list   [--url URL]  (run-time keys; see key add -h)
  oncegate ledger verify|export|bill|reconcile [--nats-url URL | --data-dir DIR] ... (see ledger -h)
  oncegate bench [--url URL] [--scenario overhead|duplicates|retry-storm|fanout|replay] [--compare URL] [--json] (see bench -h)
`

// run dispatches a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
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
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "oncegate: unknown command %q\n%s", cmd, usage)
	return 2
}
