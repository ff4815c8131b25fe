package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// The dashboard's CPU cost (issue 14: 20 open dashboards add under 2 % gateway CPU at
// 500 req/s). Off by default: it is a measurement, for a quiet machine.
var (
	dashCPU     = flag.Bool("dashboard.cpu", false, "run TestDashboardCPU (a measurement: run it on a quiet machine)")
	dashRate    = flag.Int("dashboard.rate", 500, "TestDashboardCPU: new intents per second")
	dashViewers = flag.Int("dashboard.viewers", 20, "TestDashboardCPU: dashboards open in the 'on' phases")
	dashPhase   = flag.Duration("dashboard.phase", 20*time.Second, "TestDashboardCPU: length of each phase")
	dashRounds  = flag.Int("dashboard.rounds", 3, "TestDashboardCPU: off/on pairs of phases")
)

// TestDashboardCPU runs the oncegate binary (serve, embedded NATS, the mock backend) as a
// process of its own, drives it at -dashboard.rate new intents per second from this process,
// and measures the gateway process's CPU (user + system, /proc/PID/stat) in alternating
// phases without and with -dashboard.viewers dashboard streams open (each read to the end,
// like a page). Phases alternate off, on, off, on … after a warm-up, so a drift of the
// machine falls on both; it reports each phase and the mean cost of the dashboards, in
// cores and relative to the gateway's CPU without them.
func TestDashboardCPU(t *testing.T) {
	if !*dashCPU {
		t.Skip("a measurement: run with -dashboard.cpu (see README, Dashboard)")
	}
	bin := oncegateBinary(t)
	addr := testkit.FreeAddr(t)
	gw := startProc(t, "gateway", bin, "serve", "--listen", addr, "--data-dir", filepath.Join(t.TempDir(), "data"))
	base := "http://" + addr
	waitReady(t, base, gw)
	pid := gw.cmd.Process.Pid

	var seq atomic.Int64
	phase := func(name string, viewers int, d time.Duration) (cores float64, sent, failed int64) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var views atomic.Int64
		for range viewers {
			wg.Go(func() { readDashboard(ctx, base, &views) })
		}
		if viewers > 0 { // every stream open before the measurement starts
			testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
				if n := views.Load(); n < int64(viewers) {
					return fmt.Errorf("%d of %d dashboards open", n, viewers)
				}
				return nil
			})
		}
		cpu0, t0 := procCPU(t, pid), time.Now()
		sent, failed = paced(base, *dashRate, d, &seq)
		cpu1, t1 := procCPU(t, pid), time.Now()
		cancel()
		wg.Wait()
		cores = (cpu1 - cpu0).Seconds() / t1.Sub(t0).Seconds()
		t.Logf("%-8s dashboards=%-3d sent=%d failed=%d (%.0f/s) gateway CPU %.3f cores", name, viewers, sent, failed,
			float64(sent)/t1.Sub(t0).Seconds(), cores)
		return cores, sent, failed
	}
	phase("warm-up", 0, *dashPhase/2)
	var off, on float64
	for i := range *dashRounds {
		c, _, _ := phase(fmt.Sprintf("off %d", i+1), 0, *dashPhase)
		off += c
		c, _, _ = phase(fmt.Sprintf("on %d", i+1), *dashViewers, *dashPhase)
		on += c
	}
	off /= float64(*dashRounds)
	on /= float64(*dashRounds)
	rel := 0.0
	if off > 0 {
		rel = 100 * (on - off) / off
	}
	t.Logf("RESULT rate=%d/s dashboards=%d phase=%s rounds=%d: gateway CPU %.3f cores without, %.3f with; the dashboards add %.4f cores (%+.2f %% of the gateway's CPU)",
		*dashRate, *dashViewers, *dashPhase, *dashRounds, off, on, on-off, rel)
}

// readDashboard reads one dashboard stream until ctx ends, counting it in open once it is.
func readDashboard(ctx context.Context, base string, open *atomic.Int64) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/dashboard/stream", nil)
	if err != nil {
		return
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	go func() {
		<-ctx.Done()
		resp.Body.Close()
	}()
	buf := make([]byte, 512)
	if _, err := resp.Body.Read(buf); err != nil { // the first bytes: the stream is open
		return
	}
	open.Add(1)
	_, _ = io.Copy(io.Discard, resp.Body)
}

// paced sends rate new intents (non-stream, default mock) per second for d, each with a
// fresh message; it returns how many were sent and how many failed.
func paced(base string, rate int, d time.Duration, seq *atomic.Int64) (sent, failed int64) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.After(d)
	sem := make(chan struct{}, 512)
	var wg sync.WaitGroup
	var nFailed atomic.Int64
	for {
		select {
		case <-end:
			wg.Wait()
			return sent, nFailed.Load()
		case <-tick.C:
		}
		sent++
		sem <- struct{}{}
		n := seq.Add(1)
		wg.Go(func() {
			defer func() { <-sem }()
			r := send(http.MethodPost, base+chatPath, chatBody("oncegate-mock", "cpu "+strconv.FormatInt(n, 10), ""), nil)
			if r.Err != nil || r.Status != http.StatusOK {
				nFailed.Add(1)
			}
		})
	}
}

// procCPU is the user + system CPU time process pid has used (/proc/PID/stat, clock ticks of
// 10 ms: Linux's USER_HZ is 100).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces) in parentheses: utime is the 14th
	// field of the line, stime the 15th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}
