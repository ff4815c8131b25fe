package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/bench"
	"github.com/oncegate/oncegate/internal/testkit"
)

// Memory per request (issue 17: 48 concurrent 4 MiB requests; peak RSS at most 2× the bodies in
// flight above the baseline, and back near the baseline after). Off by default: a measurement.
var (
	memRequests = flag.Bool("memory", false, "run TestMemoryPerRequest (a measurement: run it on a quiet machine)")
	memN        = flag.Int("memory.n", 48, "TestMemoryPerRequest: concurrent requests")
	memBytes    = flag.Int("memory.bytes", 4<<20, "TestMemoryPerRequest: body size of each request")
	memInFlight = flag.Int64("memory.inflight", 0, "TestMemoryPerRequest: admission.max_body_bytes_in_flight of the gateway (0: none)")
	memWait     = flag.Duration("memory.wait", 30*time.Second, "TestMemoryPerRequest: how long after the burst the last RSS is read")
	memLimit    = flag.String("memory.gomemlimit", "", "TestMemoryPerRequest: the gateway's GOMEMLIMIT (the Go runtime's soft memory limit; empty: none)")
	memContent  = flag.String("memory.content", "words", "TestMemoryPerRequest: what each body's prompt is made of: words (bench.Words: varied text, about 2× compressible by a fast compressor), random (base64 of random bytes: incompressible) or repeat (one letter repeated: compresses to nothing; the rounds before round 6 sent it)")
	memProfile  = flag.String("memory.profile", "", "TestMemoryPerRequest: write the gateway's heap profiles (after the burst, and 30 s later, each after a collection so that they count every allocation) to FILE-burst and FILE-30s")
)

// procMem reads a process's VmRSS and VmHWM (its peak RSS) in bytes from /proc.
func procMem(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// allocated reads the gateway's go_memstats_alloc_bytes_total (bytes allocated since its
// start) from /metrics: what a burst allocates, which unlike its RSS does not depend on when the
// collector ran.
func allocated(t *testing.T, base string) int64 {
	t.Helper()
	r := send(http.MethodGet, base+"/metrics", "", nil)
	if r.Err != nil || r.Status != http.StatusOK {
		t.Fatalf("metrics: %v %d", r.Err, r.Status)
	}
	for line := range strings.Lines(string(r.Body)) {
		if v, ok := strings.CutPrefix(line, "go_memstats_alloc_bytes_total "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("go_memstats_alloc_bytes_total %q: %v", v, err)
			}
			return int64(f)
		}
	}
	t.Fatal("/metrics has no go_memstats_alloc_bytes_total")
	return 0
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// TestMemoryPerRequest runs the oncegate binary and its mock as processes of their own,
// sends -memory.n concurrent new non-stream requests of -memory.bytes each, and reports the
// gateway's RSS: the baseline after a warm-up, the peak (VmHWM) during the burst, and 5 s and
// -memory.wait after it, each against the bodies in flight. It asserts only that every request was
// answered (200, or 503 when the in-flight bound refused it); the figures go to BENCHMARKS.md.
func TestMemoryPerRequest(t *testing.T) {
	if !*memRequests {
		t.Skip("a measurement: run with -memory")
	}
	bin := oncegateBinary(t)
	mockAddr, addr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	mock := startProc(t, "mock", bin, "mock", "--listen", mockAddr, "--tokens", "16")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gw.yaml")
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
log_level: warn
http: {max_body_bytes: %d}
nats: {max_payload: %d}
admission: {max_body_bytes_in_flight: %d}
backends:
  - {name: up, type: openai, base_url: "http://%s/v1", models: [oncegate-mock-up], timeout: 120s}
routes:
  - {model: oncegate-mock, backends: [up]}
`, addr, filepath.Join(dir, "data"), *memBytes+(1<<20), 2**memBytes+(4<<20), *memInFlight, mockAddr)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "--config", cfgPath}
	pprofAddr := testkit.FreeAddr(t)
	if *memProfile != "" {
		args = append(args, "--pprof", pprofAddr)
	}
	var env []string
	if *memLimit != "" {
		env = append(env, "GOMEMLIMIT="+*memLimit)
	}
	gw := startProcEnv(t, "gateway", env, bin, args...)
	heap := func(suffix string) {
		if *memProfile == "" {
			return
		}
		r := send(http.MethodGet, "http://"+pprofAddr+"/debug/pprof/heap?gc=1", "", nil)
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("heap profile: %v %d", r.Err, r.Status)
		}
		if err := os.WriteFile(*memProfile+"-"+suffix, r.Body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://" + addr
	waitReady(t, base, gw, mock)
	pid := gw.cmd.Process.Pid
	body := func(i, size int) string {
		var pad string
		switch *memContent {
		case "words":
			pad = bench.Words(size, uint64(i))
		case "random":
			raw := make([]byte, size*3/4)
			_, _ = rand.Read(raw) // never fails (crypto/rand)
			pad = base64.StdEncoding.EncodeToString(raw)
		case "repeat":
			pad = string(bytes.Repeat([]byte{'a' + byte(i%26)}, size))
		default:
			t.Fatalf("-memory.content %q: want words, random or repeat", *memContent)
		}
		return chatBody("oncegate-mock", fmt.Sprintf("memory %d %d %s", i, time.Now().UnixNano(), pad), "")
	}
	for i := range 8 { // warm-up: every path once, small
		if r := send(http.MethodPost, base+chatPath, body(i, 1024), nil); r.Status != http.StatusOK {
			t.Fatalf("warm-up %d: status %d: %s", i, r.Status, r.Body)
		}
	}
	time.Sleep(3 * time.Second)
	baseRSS, baseHWM := procMem(t, pid)
	allocBefore := allocated(t, base)

	bodies := make([]string, *memN)
	for i := range bodies {
		bodies[i] = body(i+100, *memBytes)
	}
	results := make([]result, *memN)
	var wg sync.WaitGroup
	for i := range bodies {
		wg.Go(func() { results[i] = send(http.MethodPost, base+chatPath, bodies[i], nil) })
	}
	wg.Wait()
	bodies = nil
	_, peak := procMem(t, pid)
	burstAlloc := allocated(t, base) - allocBefore
	heap("burst")
	ok, shed := 0, 0
	for i, r := range results {
		switch {
		case r.Err != nil:
			t.Fatalf("request %d: %v", i, r.Err)
		case r.Status == http.StatusOK:
			ok++
		case r.Status == http.StatusServiceUnavailable && *memInFlight > 0:
			expectShed(t, r)
			shed++
		default:
			t.Fatalf("request %d: status %d: %.300s", i, r.Status, r.Body)
		}
	}
	time.Sleep(5 * time.Second)
	after5, _ := procMem(t, pid)
	time.Sleep(*memWait - 5*time.Second)
	after30, _ := procMem(t, pid)
	heap("30s")
	inFlight := int64(*memN) * int64(*memBytes)
	t.Logf("%d concurrent requests of %s (%s of bodies, %s; max_body_bytes_in_flight %d): %d answered, %d shed",
		*memN, mib(int64(*memBytes)), mib(inFlight), *memContent, *memInFlight, ok, shed)
	t.Logf("gateway RSS: baseline %s (peak so far %s); peak during the burst %s, %s above the baseline = %.2f× the bodies; after 5 s %s, after %s %s (%s above the baseline)",
		mib(baseRSS), mib(baseHWM), mib(peak), mib(peak-baseRSS), float64(peak-baseRSS)/float64(inFlight), mib(after5), *memWait, mib(after30), mib(after30-baseRSS))
	t.Logf("gateway allocations during the burst: %s = %.2f× the bodies", mib(burstAlloc), float64(burstAlloc)/float64(inFlight))
}
