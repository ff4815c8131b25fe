package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/oncegate/oncegate/internal/config"
)

// configMain is `oncegate config check FILE`: every problem of the file (unknown fields with
// the nearest known name, wrong types, validation), one line each as "FILE:LINE: path:
// message", then how many; exit 1 if any.
func configMain(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprint(stderr, "usage: oncegate config check FILE\n")
		return 2
	}
	cfg, err := config.LoadWith(args[1], getenv)
	if err != nil {
		var fe *config.FileError
		if errors.As(err, &fe) {
			fmt.Fprintf(stderr, "%s\n%s: %d error(s)\n", fe.Error(), args[1], len(fe.Problems))
			return 1
		}
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok (%d backends, %d models, %d tenants)\n", args[1], len(cfg.Backends), len(cfg.ModelNames()), len(cfg.Tenants))
	return 0
}
