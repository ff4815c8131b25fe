package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/oncegate/oncegate/internal/config"
)

// configMain is `oncegate config check FILE`: every error with its field path, exit 1 if any.
func configMain(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprint(stderr, "usage: oncegate config check FILE\n")
		return 2
	}
	cfg, err := config.LoadWith(args[1], getenv)
	if err != nil {
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			fmt.Fprintf(stderr, "%s: %d error(s)\n", args[1], len(ve.Errors))
			for _, fe := range ve.Errors {
				fmt.Fprintf(stderr, "  %s\n", fe.Error())
			}
			return 1
		}
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok (%d backends, %d models, %d tenants)\n", args[1], len(cfg.Backends), len(cfg.ModelNames()), len(cfg.Tenants))
	return 0
}
