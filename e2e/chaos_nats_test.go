package e2e

// Rows 3a, 3b and 3c of the fault suite (notes/reliability-matrix.md row 3): NATS server
// loss, on three stock nats-server processes (natsproc_test.go) instead of the in-process
// cluster. While a trial's intents run (copies stream and not, on both API nodes), a
// probe client on each API node sends short intents one after another: its answers measure
// the unavailability window. Every intent, the probes' too, is checked against I1-I5.
//
// A NATS fault may outlast the workers' 2 s lease (an election takes 4-9 s), so a takeover
// is allowed (takeoverOK): each one counted in the record explains one more execution. A
// claim that was acknowledged and then lost has no takeover to explain it: a duplicate.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

// natsRowOptions are the topology options of the rows of this file (none for the others).
func natsRowOptions(row string) []chaosOption {
	switch row {
	case "3a", "3b", "3c":
		return []chaosOption{onNATSProcs("always")}
	case "3c-1s": // the control of 3c: the file store synced every second, not on every write
		return []chaosOption{onNATSProcs("1s")}
	case "18":
		// Stock nats-server processes (the check: its default limits, 1,000 consumers
		// per stream), and a NATS that does not share this process's heap: in process, the
		// servers ran on the harness's garbage collector, whose work grows with every
		// transcript the soak keeps.
		return []chaosOption{onNATSProcs("always")}
	}
	return nil
}

// natsTrialCount is the trials of a NATS row: each waits out elections, so the short
// version runs fewer than the other rows.
func natsTrialCount(short int) int {
	if *chaosTrials > 0 || *chaosLong {
		return chaosTrialCount()
	}
	return short
}

// Row 3a: SIGKILL the server leading KV_IDEM (then LEDGER, then JOBS, in turn) while a
// trial's intents run, and start it again after a seeded 1-5 s.
func chaosNATSKill(t *testing.T, c *chaosEnv, s *rowStats) {
	streams := []string{kv.BucketStream, ledger.StreamName, jobs.JobsStream}
	c.natsFaultRow(t, s, "3a", func(trial int) (string, func()) {
		stream := streams[trial%len(streams)]
		leader := c.waitLeader(stream)
		down := time.Duration(1000+c.rng.IntN(4001)) * time.Millisecond
		c.procs.Kill(leader)
		return fmt.Sprintf("SIGKILL %s (leader of %s) for %s", c.procs.nodes[leader].name, stream, down), func() {
			time.Sleep(down) // the seeded outage itself, not a synchronization
			c.procs.Start(leader)
		}
	})
}

// Row 3b: cut every route link of the server leading KV_IDEM (a minority of one) for a
// seeded 2-6 s, then heal. Its clients stay connected to it and keep trying; the API nodes
// know all three URLs.
func chaosNATSPartition(t *testing.T, c *chaosEnv, s *rowStats) {
	c.natsFaultRow(t, s, "3b", func(int) (string, func()) {
		leader := c.waitLeader(kv.BucketStream)
		cut := time.Duration(2000+c.rng.IntN(4001)) * time.Millisecond
		c.procs.Isolate(leader)
		return fmt.Sprintf("isolate %s (leader of %s) for %s", c.procs.nodes[leader].name, kv.BucketStream, cut), func() {
			time.Sleep(cut) // the seeded partition itself
			c.procs.Heal()
		}
	})
}

func (c *chaosEnv) waitLeader(stream string) int {
	c.t.Helper()
	leader := -1
	testkit.CheckFor(c.t, chaosSettle, pollEvery, func() error {
		if leader = c.procs.StreamLeader(stream); leader < 0 {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		return nil
	})
	return leader
}

// natsFaultRow runs the trials of 3a or 3b: load, a fault mid-generation (inject returns
// what it did and how it ends), the cluster healthy again, then the invariants and the
// probes' unavailability window.
func (c *chaosEnv) natsFaultRow(t *testing.T, s *rowStats, row string, inject func(trial int) (string, func())) {
	var jobIDs []string
	var windows []time.Duration
	for trial := range natsTrialCount(1) {
		specs := c.trialIntents(row, trial)
		wait := c.startCopies(specs, func(int) []copyPlan { return c.seededCopies() })
		pr := c.startProbes(row, trial)
		c.victimExecution(c.chaosMidGeneration())
		at := time.Now()
		what, end := inject(trial)
		markFault(specs, nil, at)
		end()
		healed := time.Now()
		c.procs.WaitHealthy()
		wait()
		probes := pr.stop(t, healed)
		w := measureWindow(probes, at)
		windows = append(windows, w.window)
		s.longestGap = max(s.longestGap, w.gap)
		t.Logf("row %s trial %d: %s; healed %s after the fault; unavailability window %s, longest time without a successful answer %s, %d of %d probe exchanges failed (%s); %d takeovers",
			row, trial, what, healed.Sub(at).Round(time.Millisecond), w.window.Round(time.Millisecond), w.gap.Round(time.Millisecond),
			w.failed, w.exchanges, strings.Join(w.errs, ", "), takeoverCount(t, c, append(specs, probes...)))
		if lines := c.newErrorLines(); lines != "" {
			t.Logf("row %s trial %d: the gateway processes logged errors (and with -chaos.warnings, warnings):\n%s", row, trial, lines)
		}
		c.checkTrial(s, specs, func() {}, takeoverOK, &jobIDs)
		for _, sp := range probes {
			if id := c.checkIntent(s, sp, takeoverOK); id != "" {
				jobIDs = append(jobIDs, id)
			}
		}
	}
	t.Logf("row %s: unavailability window p50 %s p99 %s over %d trials", row, percentile(windows, 50), percentile(windows, 99), len(windows))
	c.finishRow(s, jobIDs)
}

// newErrorLines is the error-level log lines of every gateway process since the last call:
// what a trial's failed probes or checks are to be read with.
func (c *chaosEnv) newErrorLines() string {
	var b strings.Builder
	for _, n := range append(slices.Clone(c.workers), c.apis...) {
		log := n.p.log.String()
		if c.logSeen == nil {
			c.logSeen = map[*proc]int{}
		}
		from := min(c.logSeen[n.p], len(log))
		c.logSeen[n.p] = len(log)
		for _, line := range strings.Split(log[from:], "\n") {
			if strings.Contains(line, `"level":"error"`) || (*chaosWarn && strings.Contains(line, `"level":"warn"`)) {
				fmt.Fprintf(&b, "  %s: %s\n", n.name, line)
			}
		}
	}
	return b.String()
}

func takeoverCount(t *testing.T, c *chaosEnv, specs []*intentSpec) int {
	n := 0
	for _, sp := range specs {
		v, _ := idemStatus(t, c.apis[0].base, sp.key, nil)["takeovers"].(float64)
		n += int(v)
	}
	return n
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, len(d)*p/100)].Round(time.Millisecond)
}

// ---- the probes ----

// probeSpare is how many probe intents each node's probe has ready per trial (reference
// answers are made on the test's goroutine); a probe that runs out stops early.
const probeSpare = 300

// probes is one probe client per API node, each sending short non-stream intents one after
// another (runCopy: retried with the same key on the other node until answered).
type probes struct {
	stopCh chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	sent   []*intentSpec
	lastOK []time.Time // per node: the end of its last successful answer
}

func (c *chaosEnv) startProbes(row string, trial int) *probes {
	pr := &probes{stopCh: make(chan struct{}), lastOK: make([]time.Time, len(c.apis))}
	for node := range c.apis {
		ready := make([]*intentSpec, probeSpare)
		for i := range ready {
			ready[i] = c.newIntent(fmt.Sprintf("chaos row %s trial %d probe %d/%d seed %d", row, trial, node, i, *chaosSeed), 2)
		}
		pr.wg.Add(1)
		go func() {
			defer pr.wg.Done()
			for _, sp := range ready {
				select {
				case <-pr.stopCh:
					return
				default:
				}
				sp.invoked = time.Now()
				cr := c.runCopy(sp, false, node, nil)
				pr.mu.Lock()
				pr.sent = append(pr.sent, sp)
				if cr.final != nil {
					pr.lastOK[node] = cr.done
				}
				pr.mu.Unlock()
				time.Sleep(200 * time.Millisecond) // the probe's pace: the window's resolution
			}
		}()
	}
	return pr
}

// stop waits until each node's probe has had an answer after healed, stops them, and returns
// every probe intent sent.
func (pr *probes) stop(t *testing.T, healed time.Time) []*intentSpec {
	t.Helper()
	testkit.CheckFor(t, chaosSettle, pollEvery, func() error {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		for node, ok := range pr.lastOK {
			if !ok.After(healed) {
				return fmt.Errorf("the probe on API node %d has had no answer since the fault healed", node)
			}
		}
		return nil
	})
	close(pr.stopCh)
	pr.wg.Wait()
	return pr.sent
}

// window is what the probes saw of one fault.
type window struct {
	window    time.Duration // first failed or stalled exchange after the fault -> the next success
	gap       time.Duration // the longest time without any successful answer, from the fault on
	exchanges int
	failed    int
	errs      []string
}

// probeStall is how long a probe exchange may take before it counts as stalled: a probe is
// a 2-token generation (100 ms at the mock's pace). A measurement, not an assertion.
const probeStall = time.Second

// measureWindow is the figures of one fault from the probes' exchanges, per probe client
// (the API node it sends to first), the worst client's.
func measureWindow(probes []*intentSpec, fault time.Time) window {
	var w window
	counts := map[string]int{}
	type history struct {
		oks      []time.Time
		firstBad time.Time
	}
	clients := map[int]*history{}
	for _, sp := range probes {
		for _, cr := range sp.copies {
			h := clients[cr.attempts[0].node]
			if h == nil {
				h = &history{}
				clients[cr.attempts[0].node] = h
			}
			for _, a := range cr.attempts {
				w.exchanges++
				ok := a.ok(false)
				if ok {
					h.oks = append(h.oks, a.end)
				} else {
					w.failed++
					counts[exchangeError(a)]++
				}
				stalled := a.end.Sub(a.start) >= probeStall
				if (!ok || stalled) && a.end.After(fault) && (h.firstBad.IsZero() || a.start.Before(h.firstBad)) {
					h.firstBad = a.start
				}
			}
		}
	}
	for _, h := range clients {
		sort.Slice(h.oks, func(i, j int) bool { return h.oks[i].Before(h.oks[j]) })
		prev := fault
		for _, ok := range h.oks {
			if ok.After(fault) {
				w.gap = max(w.gap, ok.Sub(prev))
				prev = ok
			}
		}
		if h.firstBad.IsZero() {
			continue
		}
		for _, ok := range h.oks {
			if ok.After(h.firstBad) {
				w.window = max(w.window, ok.Sub(h.firstBad))
				break
			}
		}
	}
	for k, n := range counts {
		w.errs = append(w.errs, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(w.errs)
	return w
}

// exchangeError names how an exchange failed, for the trial's log line.
func exchangeError(a attempt) string {
	if a.err != nil {
		msg := a.err.Error()
		if len(msg) > 60 {
			msg = msg[:60]
		}
		return msg
	}
	return fmt.Sprintf("status %d %.80s", a.status, a.raw)
}

// ---- row 3c: power loss ----

// Row 3c (and its control 3c-1s): a power cut of the whole cluster under load, the
// nats-server suite's TestJetStreamClusterHardKillAfterStreamAdd pattern: copy every store
// directory, kill every server, restore the copies, start them all again.
//
// What a directory copy can simulate: the copy reads files through the page cache, so it
// holds every write the servers made, fsynced or not. It is a crash of the three processes
// at one instant, not the loss of what the kernel had not yet written to the disk; a real
// power cut loses that too, and only that loss tells `sync_interval: always` from `1s`.
// Simulating it needs a filesystem that forgets unsynced writes (Jepsen's lazyfs, dm-flakey
// or dm-log-writes), which this machine does not offer. The most faithful thing done here:
// SIGSTOP all three first, so the copies are one instant of the whole cluster (no server
// writes while another is copied), then SIGKILL them (no shutdown path flushes or hands
// leadership over) and restore the copies. The control is expected to lose nothing for
// that reason, and the row reports what it sees.
func chaosPowerLoss(t *testing.T, c *chaosEnv, s *rowStats) {
	var jobIDs []string
	for trial := range natsTrialCount(1) {
		specs := c.trialIntents(s.row, trial)
		wait := c.startCopies(specs, func(int) []copyPlan { return c.seededCopies() })
		c.victimExecution(c.chaosMidGeneration())
		before := c.acknowledged()
		at := time.Now()
		markFault(specs, nil, at)
		c.powerCut()
		c.procs.WaitHealthy()
		up := time.Since(at)
		wait()
		lost := c.lostSince(before)
		for _, l := range lost {
			s.ackedLost++
			s.fail(t, "row %s: acknowledged before the power cut, lost after it: %s", s.row, l)
		}
		t.Logf("row %s trial %d: power cut of the 3 servers, healthy again %s later; before it %d records and %d ledger entries acknowledged, %d lost; %d takeovers",
			s.row, trial, up.Round(time.Millisecond), len(before.records), len(before.ledger), len(lost), takeoverCount(t, c, specs))
		if lines := c.newErrorLines(); lines != "" {
			t.Logf("row %s trial %d: the gateway processes logged errors:\n%s", s.row, trial, lines)
		}
		c.checkTrial(s, specs, func() {}, takeoverOK, &jobIDs)
	}
	c.finishRow(s, jobIDs)
}

// acked is what the cluster had acknowledged at one moment: every IDEM record's revision,
// every LEDGER entry's digest by sequence.
type acked struct {
	records map[string]uint64
	ledger  map[uint64][32]byte
}

func (c *chaosEnv) acknowledged() acked {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := acked{records: map[string]uint64{}, ledger: map[uint64][32]byte{}}
	store, err := c.js.KeyValue(ctx, kv.Bucket)
	if err != nil {
		c.t.Fatal(err)
	}
	keys, err := store.ListKeys(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	for k := range keys.Keys() {
		e, err := store.Get(ctx, k)
		if err != nil {
			c.t.Fatalf("IDEM %s: %v", k, err)
		}
		a.records[k] = e.Revision()
	}
	st, err := c.js.Stream(ctx, ledger.StreamName)
	if err != nil {
		c.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			c.t.Fatalf("LEDGER seq %d: %v", seq, err)
		}
		a.ledger[seq] = sha256.Sum256(append([]byte(m.Subject+"\n"), m.Data...))
	}
	return a
}

// lostSince lists what a held that the cluster no longer has: a record missing or at an
// older revision, a ledger entry missing or different.
func (c *chaosEnv) lostSince(a acked) []string {
	c.t.Helper()
	// After a power cut the servers answer health checks before every stream has elected its
	// leader again (CI, under load, saw the reads below outlast 30 s): wait for both streams
	// to answer first, so the reads measure what was kept, not how long an election takes.
	testkit.CheckFor(c.t, time.Minute, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, name := range []string{kv.BucketStream, ledger.StreamName} {
			if _, err := c.js.Stream(ctx, name); err != nil {
				return fmt.Errorf("stream %s: %w", name, err)
			}
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lost []string
	store, err := c.js.KeyValue(ctx, kv.Bucket)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, rev := range a.records {
		e, err := store.Get(ctx, k)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			lost = append(lost, fmt.Sprintf("IDEM record %s (revision %d) is gone", k, rev))
		case err != nil:
			c.t.Fatalf("IDEM %s: %v", k, err)
		case e.Revision() < rev:
			lost = append(lost, fmt.Sprintf("IDEM record %s is back at revision %d, was %d", k, e.Revision(), rev))
		}
	}
	st, err := c.js.Stream(ctx, ledger.StreamName)
	if err != nil {
		c.t.Fatal(err)
	}
	for seq, sum := range a.ledger {
		m, err := st.GetMsg(ctx, seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			lost = append(lost, fmt.Sprintf("LEDGER entry %d is gone", seq))
		case err != nil:
			c.t.Fatalf("LEDGER seq %d: %v", seq, err)
		case sha256.Sum256(append([]byte(m.Subject+"\n"), m.Data...)) != sum:
			lost = append(lost, fmt.Sprintf("LEDGER entry %d is another entry now", seq))
		}
	}
	sort.Strings(lost)
	return lost
}

// powerCut freezes the three servers, copies their store directories, kills them, puts the
// copies back and starts them again.
func (c *chaosEnv) powerCut() {
	c.t.Helper()
	n := c.procs.Size()
	for i := range n {
		c.procs.Signal(i, syscall.SIGSTOP)
	}
	snaps := make([]string, n)
	for i := range n {
		snaps[i] = c.t.TempDir()
		if err := os.CopyFS(snaps[i], os.DirFS(c.procs.StoreDir(i))); err != nil {
			c.t.Fatalf("copy the store of %s: %v", c.procs.nodes[i].name, err)
		}
	}
	for i := range n {
		c.procs.Kill(i) // SIGKILL ends a stopped process too
	}
	for i := range n {
		dir := c.procs.StoreDir(i)
		if err := os.RemoveAll(dir); err != nil {
			c.t.Fatal(err)
		}
		if err := os.CopyFS(dir, os.DirFS(snaps[i])); err != nil {
			c.t.Fatalf("restore the store of %s: %v", c.procs.nodes[i].name, err)
		}
	}
	for i := range n {
		c.procs.Start(i)
	}
}
