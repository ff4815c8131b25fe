package e2e

// The worker scaling curve (issue 12): 1, 2, 4 (and more) worker processes on one NATS, a
// paced mock so each generation lasts a fixed time and the workload is bound by the workers'
// concurrency, closed-loop load well above what the workers can hold. Throughput should grow
// with the workers until the machine's CPU is the bound, and jobs should spread evenly.
// Each worker calls its own mock process, so its executions are counted on their own.
//
//	go test -count=1 -v -run TestWorkerScaling ./e2e -scaling -scaling.workers 1,2,4,8   # task bench:scaling
//
// It is a measurement, skipped unless -scaling is given; run it on a quiet machine. It asserts
// only what does not depend on the machine's speed: every successful request was executed by
// exactly one worker, and each worker's share of the jobs is at least half an even share.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/bench"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
)

var (
	scaling            = flag.Bool("scaling", false, "run the worker scaling curve (a measurement: quiet machine)")
	scalingWorkers     = flag.String("scaling.workers", "1,2,4,8", "worker process counts, in order")
	scalingDuration    = flag.Duration("scaling.duration", 20*time.Second, "measured time per step")
	scalingConcurrency = flag.Int("scaling.concurrency", 256, "closed-loop clients (above every step's capacity)")
	scalingSlots       = flag.Int("scaling.slots", 8, "concurrent executions per worker process")
	scalingInterToken  = flag.Duration("scaling.inter-token", 10*time.Millisecond, "the mock's pace")
	scalingTokens      = flag.Int("scaling.tokens", 20, "the mock's tokens per answer")
)

// scalingStep is what one worker count measured.
type scalingStep struct {
	workers   int
	rep       bench.Result
	perWorker []int64 // completed executions per worker's mock
	cpuBusy   float64 // the machine's CPU busy fraction during the measured time
}

func TestWorkerScaling(t *testing.T) {
	if !*scaling {
		t.Skip("a measurement: run with -scaling on a quiet machine")
	}
	var counts []int
	for _, f := range strings.Split(*scalingWorkers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			t.Fatalf("-scaling.workers %q: want a list of positive counts", *scalingWorkers)
		}
		counts = append(counts, n)
	}
	bin := oncegateBinary(t)
	gen := time.Duration(*scalingTokens) * *scalingInterToken
	var steps []scalingStep
	for _, n := range counts {
		t.Run(fmt.Sprintf("workers=%d", n), func(t *testing.T) {
			steps = append(steps, measureWorkers(t, bin, n))
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "worker scaling: %d slots per worker, generations of %d tokens every %s (%s), %d clients, %s per step\n",
		*scalingSlots, *scalingTokens, *scalingInterToken, gen, *scalingConcurrency, *scalingDuration)
	fmt.Fprintf(&b, "%-8s %10s %10s %10s %10s %10s  %s\n", "workers", "req/s", "vs 1st", "ceiling", "p50", "cpu busy", "jobs per worker")
	for _, s := range steps {
		ceiling := float64(s.workers**scalingSlots) / gen.Seconds()
		fmt.Fprintf(&b, "%-8d %10.1f %9.2fx %10.0f %10s %9.0f%%  %v\n", s.workers, s.rep.RequestsPerSec,
			s.rep.RequestsPerSec/steps[0].rep.RequestsPerSec, ceiling,
			s.rep.Latency.P50.Round(time.Millisecond), 100*s.cpuBusy, s.perWorker)
	}
	t.Log(b.String())
	fmt.Print(b.String())
}

// measureWorkers starts one API process with the embedded NATS, n worker processes on it,
// each with its own mock, runs the load and returns what it measured.
func measureWorkers(t *testing.T, bin string, n int) scalingStep {
	dir := t.TempDir()
	natsAddr, apiAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	var mocks []string
	for i := range n {
		addr := testkit.FreeAddr(t)
		startProc(t, fmt.Sprintf("mock-%d", i), bin, "mock", "--listen", addr,
			"--inter-token", scalingInterToken.String(), "--tokens", strconv.Itoa(*scalingTokens))
		mocks = append(mocks, "http://"+addr)
	}
	for _, m := range mocks {
		testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
			if r := send(http.MethodGet, m+"/stats", "", nil); r.Status != http.StatusOK {
				return fmt.Errorf("mock %s not serving: %d %v", m, r.Status, r.Err)
			}
			return nil
		})
	}
	api := startProc(t, "api", bin, "serve", "--role", "api", "--listen", apiAddr, "--nats-listen", natsAddr,
		"--config", scalingConfig(t, dir, "api", mocks[0]), "--data-dir", filepath.Join(dir, "api-data"))
	base := "http://" + apiAddr
	// The workers connect to the API process's embedded NATS; the API is ready once a worker
	// has posted to the status board.
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if api.exited() {
			t.Fatalf("api exited: %v\n%s", api.err, api.log.String())
		}
		c, err := net.DialTimeout("tcp", natsAddr, time.Second)
		if err != nil {
			return fmt.Errorf("the api's embedded NATS does not listen yet: %w", err)
		}
		return c.Close()
	})
	for i, m := range mocks {
		w := startProc(t, fmt.Sprintf("worker-%d", i), bin, "serve", "--role", "worker", "--nats-url", "nats://"+natsAddr,
			"--config", scalingConfig(t, dir, fmt.Sprintf("worker%d", i), m), "--data-dir", filepath.Join(dir, fmt.Sprintf("worker%d-data", i)))
		testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
			if w.exited() {
				t.Fatalf("worker %d exited: %v\n%s", i, w.err, w.log.String())
			}
			if !strings.Contains(w.log.String(), "workers started") {
				return fmt.Errorf("worker %d has not started", i)
			}
			return nil
		})
	}
	testkit.CheckFor(t, 30*time.Second, pollEvery, func() error {
		if r := send(http.MethodGet, base+"/readyz", "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("api not ready: %d %v %s", r.Status, r.Err, r.Body)
		}
		return nil
	})

	cfg := bench.DefaultConfig()
	cfg.URL, cfg.Scenario, cfg.Model = base, "overhead", config.MockModel
	cfg.Concurrency, cfg.Timeout = *scalingConcurrency, time.Minute
	warm := cfg
	warm.Duration, warm.Warmup = 3*time.Second, 0
	if _, err := bench.Run(context.Background(), warm); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	// Every request of a run has ended when Run returns, so the mocks' counts between two
	// runs are the measured run's executions.
	cfg.Duration, cfg.Warmup = *scalingDuration, 0
	before := mockCompleted(t, mocks)
	cpu0 := readCPU(t)
	rep, err := bench.Run(context.Background(), cfg)
	cpu1 := readCPU(t)
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Targets[0]
	if res.Successes == 0 || len(res.Errors) > 0 {
		t.Fatalf("%d workers: %d successes, errors %v %v", n, res.Successes, res.Errors, res.ErrorSamples)
	}
	after := mockCompleted(t, mocks)
	step := scalingStep{workers: n, rep: res, cpuBusy: cpu1.busySince(cpu0)}
	var total int64
	for i := range mocks {
		step.perWorker = append(step.perWorker, after[i]-before[i])
		total += after[i] - before[i]
	}
	// Exactly once, whichever worker ran it: the overhead scenario sends a new key per request.
	if total != res.Requests {
		t.Errorf("%d workers: the mocks completed %d executions for %d requests", n, total, res.Requests)
	}
	for i, c := range step.perWorker {
		if even := float64(total) / float64(n); float64(c) < even/2 {
			t.Errorf("%d workers: worker %d ran %d of %d jobs, under half an even share (%.0f)", n, i, c, total, even)
		}
	}
	return step
}

// scalingConfig writes a process's config: its backend is the mock at base.
func scalingConfig(t *testing.T, dir, name, base string) string {
	t.Helper()
	yaml := fmt.Sprintf(`log_level: info
workers: {concurrency: %d}
backends:
  - {name: mock, type: openai, base_url: %q, models: [%s], timeout: 60s}
`, *scalingSlots, base+"/v1", config.MockModel)
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mockCompleted is each mock's count of completed answers.
func mockCompleted(t *testing.T, mocks []string) []int64 {
	t.Helper()
	var out []int64
	for _, m := range mocks {
		r := send(http.MethodGet, m+"/stats", "", nil)
		var st struct {
			Completed int64 `json:"completed"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &st) != nil {
			t.Fatalf("stats of %s: %d %v %q", m, r.Status, r.Err, r.Body)
		}
		out = append(out, st.Completed)
	}
	return out
}

// cpuTimes is the machine's CPU time from /proc/stat, in ticks.
type cpuTimes struct{ busy, total int64 }

func readCPU(t *testing.T) cpuTimes {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var c cpuTimes
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		c.total += v
		if i != 3 && i != 4 { // idle, iowait
			c.busy += v
		}
	}
	return c
}

func (c cpuTimes) busySince(old cpuTimes) float64 {
	if c.total == old.total {
		return 0
	}
	return float64(c.busy-old.busy) / float64(c.total-old.total)
}
