package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/oncegate/oncegate/internal/config"
)

// envHealthcheckURL names the URL `oncegate healthcheck` asks when --url is not given: the
// image's HEALTHCHECK command is fixed, and a container whose process serves no /readyz (a
// worker: no HTTP API) points it at what it does serve (its --metrics-listen's /metrics).
const envHealthcheckURL = "ONCEGATE_HEALTHCHECK_URL"

// healthcheckMain is `oncegate healthcheck`: GET a URL (--url, else ONCEGATE_HEALTHCHECK_URL,
// else this host's /readyz) and exit 0 on a 2xx answer, 1 on anything else, with one line on
// stderr saying what it got. A distroless or scratch image has no curl: the image's
// HEALTHCHECK runs this.
func healthcheckMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("url", "", "URL to GET (default $"+envHealthcheckURL+", else http://127.0.0.1:PORT/readyz, PORT from ONCEGATE_LISTEN, else 8080)")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "oncegate healthcheck: unexpected argument %q; pass the URL as --url\n", fs.Arg(0))
		return 2
	}
	u, from := *target, "--url"
	if u == "" {
		u, from = getenv(envHealthcheckURL), envHealthcheckURL
	}
	if u == "" {
		var err error
		if u, err = readyzURL(getenv(config.EnvListen)); err != nil {
			fmt.Fprintf(stderr, "oncegate healthcheck: %v; pass --url\n", err)
			return 2
		}
	}
	if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		fmt.Fprintf(stderr, "oncegate healthcheck: %s %q is not an http(s) URL\n", from, u)
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "oncegate healthcheck: --timeout must be positive, got %s\n", *timeout)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	status, err := get(ctx, u)
	if err != nil {
		fmt.Fprintf(stderr, "oncegate healthcheck: %v\n", err)
		return 1
	}
	if status < 200 || status > 299 {
		fmt.Fprintf(stderr, "oncegate healthcheck: GET %s: %d %s\n", u, status, http.StatusText(status))
		return 1
	}
	fmt.Fprintf(stdout, "GET %s: %d %s\n", u, status, http.StatusText(status))
	return 0
}

// readyzURL is the /readyz URL of a gateway listening on listen (ONCEGATE_LISTEN, or the
// default): a wildcard or empty host is asked on 127.0.0.1.
func readyzURL(listen string) (string, error) {
	if listen == "" {
		listen = config.Default().Listen
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("%s %q: %w", config.EnvListen, listen, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}

// get returns the status code of GET u; the body is read (bounded) and dropped.
func get(ctx context.Context, u string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}
