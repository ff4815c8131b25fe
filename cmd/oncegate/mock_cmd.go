package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/mockllm"
)

// mockMain is `oncegate mock`: the deterministic OpenAI-compatible mock with GET /stats.
func mockMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9090", "address to listen on")
	ttft := fs.Duration("ttft", 0, "time to first token")
	inter := fs.Duration("inter-token", 0, "delay between tokens")
	tokens := fs.Int("tokens", 16, "output tokens per response")
	models := fs.String("models", "", "comma-separated model names to serve (default oncegate-mock)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var names []string
	for _, m := range strings.Split(*models, ",") {
		if m = strings.TrimSpace(m); m != "" {
			names = append(names, m)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "oncegate mock: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: mockllm.New(mockllm.Options{TTFT: *ttft, InterToken: *inter, Tokens: *tokens, Models: names}),
		ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "oncegate mock listening on http://%s/v1 (stats: GET /stats)\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return 0
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return 0
		}
		fmt.Fprintf(stderr, "oncegate mock: %v\n", err)
		return 1
	}
}
