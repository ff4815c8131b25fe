package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/bench"
)

// benchMain is `oncegate bench`: load an OpenAI-compatible endpoint (the gateway, the mock,
// or any other loopback server) and print a table, or JSON with --json.
func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := bench.DefaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: oncegate bench [flags]\n\nLoads POST <url>/v1/chat/completions and reports throughput, latency, errors and,\nwith --mock-stats, backend executions per request. Flags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.URL, "url", cfg.URL, "target base URL; requests go to <url>/v1/chat/completions")
	fs.StringVar(&cfg.CompareURL, "compare", "", "second target, run in interleaved slices with --url; prints B/A ratios")
	fs.StringVar(&cfg.Scenario, "scenario", cfg.Scenario, strings.Join(bench.Scenarios(), " | "))
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "closed loop: concurrent workers; open loop: the in-flight cap")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured time per target (more than 10m needs --allow-long)")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "unmeasured warm-up per target")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: intents per second per target (0: closed loop)")
	fs.DurationVar(&cfg.Slice, "slice", cfg.Slice, "with --compare: length of one interleaved slice")
	fs.BoolVar(&cfg.Stream, "stream", false, "request stream: true (SSE)")
	fs.Int64Var(&cfg.MaxRequests, "max-requests", cfg.MaxRequests, "hard cap on requests per target, warm-up included")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "per request")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model name in the request")
	fs.StringVar(&cfg.CompareModel, "compare-model", "", "model name in requests to --compare (default: --model), e.g. a router's provider/model")
	fs.IntVar(&cfg.PromptBytes, "prompt-bytes", 0, "pad each prompt to this many bytes (0: one line)")
	mockTokens := fs.Int("mock-tokens", 0, `mock knob "tokens": output tokens (default: the mock's; fanout: 200)`)
	var mockITL, mockTTFT msDuration
	fs.Var(&mockITL, "mock-itl", `mock knob "inter_token_ms": 5 or 5ms (default: the mock's; fanout: 5ms)`)
	fs.Var(&mockTTFT, "mock-ttft", `mock knob "ttft_ms": 200 or 200ms (default: the mock's)`)
	fs.StringVar(&cfg.Mock.Fault, "mock-fault", "", `mock knob "fault" on every request, e.g. error_503, rate_limit`)
	fs.IntVar(&cfg.Copies, "copies", cfg.Copies, "duplicates: copies of each intent fired together")
	keys := fs.Bool("keys", true, "send an Idempotency-Key per intent (retry-storm defaults to false, like the SDKs)")
	fs.DurationVar(&cfg.ClientTimeout, "client-timeout", cfg.ClientTimeout, "retry-storm: an attempt fails after this long without a byte")
	fs.IntVar(&cfg.Retries, "retries", cfg.Retries, "retry-storm: retries per call")
	fs.IntVar(&cfg.Subscribers, "subscribers", cfg.Subscribers, "fanout: late subscribers per stream")
	fs.IntVar(&cfg.KeysPool, "keys-pool", cfg.KeysPool, "replay: intents completed first, then requested again")
	fs.StringVar(&cfg.MockStatsURL, "mock-stats", "", "base URL of an oncegate mock: GET /stats before and after counts backend executions")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow targets that are not loopback addresses")
	fs.BoolVar(&cfg.AllowLong, "allow-long", false, "allow --duration over 10m and --max-requests over 10M")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	fs.Var((*headerFlag)(&cfg.Header), "header", "extra request header 'Name: value', repeatable (sent to --url and --compare, not to --mock-stats)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "send 'Authorization: Bearer KEY' to --url and --compare (a gateway with tenants)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "oncegate bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := cfg.ValidateHeaders(); err != nil {
		fmt.Fprintf(stderr, "oncegate bench: %v\n", err)
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "mock-tokens":
			cfg.Mock.Tokens = mockTokens
		case "mock-itl":
			d := time.Duration(mockITL)
			cfg.Mock.InterToken = &d
		case "mock-ttft":
			d := time.Duration(mockTTFT)
			cfg.Mock.TTFT = &d
		case "keys":
			cfg.Keys = keys
		}
	})

	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		write := bench.WriteTable
		if *jsonOut {
			write = bench.WriteJSON
		}
		if werr := write(stdout, rep); werr != nil {
			fmt.Fprintf(stderr, "oncegate bench: %v\n", werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "oncegate bench: %v\n", err)
		return 1
	}
	return 0
}

// headerFlag collects repeatable --header 'Name: value' flags; a malformed one is a flag
// error (exit 2).
type headerFlag http.Header

func (h *headerFlag) String() string { return "" }

func (h *headerFlag) Set(s string) error {
	name, value, err := bench.ParseHeader(s)
	if err != nil {
		return err
	}
	if *h == nil {
		*h = headerFlag{}
	}
	http.Header(*h).Add(name, value)
	return nil
}

// msDuration is a flag holding a duration written either as Go duration ("5ms") or as a
// bare number of milliseconds ("5"), like the mock's *_ms knobs.
type msDuration time.Duration

func (d *msDuration) String() string { return time.Duration(*d).String() }

func (d *msDuration) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		*d = msDuration(time.Duration(n) * time.Millisecond)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want milliseconds or a duration such as 5ms: %w", err)
	}
	*d = msDuration(v)
	return nil
}
