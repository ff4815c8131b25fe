package e2e

// Row 18 of the fault suite (notes/reliability-matrix.md §7.2; nats-server's
// TestLongKVPutWithServerRestarts): an open-loop rate of new intents, each with 1-3 copies on
// seeded nodes and modes, while at every interval a seeded choice restarts a NATS server
// (SIGTERM, start again), an API process or a worker process (SIGKILL, start again). The clients
// retry as the SDKs do. At the end every intent is checked against I1-I5; on the way, every
// second, the consumers of every stream are counted: they must stay bounded by the intents in
// flight, which is what keeps a stock nats-server's 1,000 consumers per stream out of reach.
//
//	go test -count=1 -run 'TestChaos/row_18' ./e2e                       # short: 12 s, 2/s, 3 restarts
//	go test -count=1 -timeout 60m -run 'TestChaos/row_18' ./e2e -chaos.long  # 30 min, 20/s, every 60 s
//	go test -count=1 -timeout 20m -run 'TestChaos/row_18' ./e2e -chaos.soak 10m -chaos.rate 20 -chaos.interval=-1s
//
// The last is the stock-server check: the row always runs on three stock nats-server
// processes (natsRowOptions: their default limits), here with no restarts, and then any client
// error fails the row.

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

var (
	chaosSoak = flag.Duration("chaos.soak", 0, "row 18's soak: how long new intents arrive (default 12s, or 30m with -chaos.long)")
	chaosRate = flag.Float64("chaos.rate", 0, "row 18's new intents per second (default 2, or 20 with -chaos.long)")
	// Negative: no restarts, the stock-server check (20 intents/s for 10 minutes, 0
	// errors, consumers bounded).
	chaosInterval = flag.Duration("chaos.interval", 0, "row 18's time between restarts (default 4s, or 60s with -chaos.long or a -chaos.soak of a minute or more; negative: none)")
)

// The soak's shape. Generations are shorter than the other rows' (0.2-1 s) so that 20
// intents/s stay within the two workers' 32 slots with one worker down.
const (
	soakMinTokens = 4
	soakMaxTokens = 20
	// soakRetries and the backoff are an SDK's: bounded, exponential, capped; the bound is
	// the deadline's as much as the count's.
	soakRetries    = 10
	soakBackoff    = 250 * time.Millisecond
	soakMaxBackoff = 2 * time.Second
	// The consumer bound: a stream holds at most its baseline, two consumers per intent in
	// flight (one per API node following its execution) and soakSlack. An intent counts as in
	// flight for soakLag after it ended: the hub deletes an ended feed's consumer right after
	// the last byte, on its own goroutine. For soakRecent after an API process or NATS server
	// restart, each intent in flight during it may add one more: a consumer whose owner died
	// (the killed API node) or whose delete failed (its NATS server going down) stays until
	// its inactive threshold (jobs' orderedInactive: 5 s, plus up to 1 s of the server's
	// jitter, plus the sample's second).
	soakLag    = 2 * time.Second
	soakRecent = 10 * time.Second
	// soakSlack: each of the four gateway processes may hold one short-lived scan consumer
	// per stream at a time (kv's lease scan, a ledger read), each deleted after its scan.
	soakSlack = 4
)

func soakParams() (dur, interval time.Duration, rate float64) {
	dur, interval, rate = 12*time.Second, 4*time.Second, 2
	if *chaosLong {
		dur, interval, rate = 30*time.Minute, 60*time.Second, 20
	}
	if *chaosSoak > 0 {
		dur = *chaosSoak
		if dur >= time.Minute {
			interval = 60 * time.Second
		}
	}
	if *chaosInterval != 0 {
		interval = *chaosInterval
	}
	if *chaosRate > 0 {
		rate = *chaosRate
	}
	return dur, interval, rate
}

// soakLoad is when each intent was in flight (its first copy sent, its last copy done), for
// the consumer sampler.
type soakLoad struct {
	mu         sync.Mutex
	start, end []time.Time
}

// during is the number of intents in flight at some moment of [from, to].
// counts is the intents started and not finished, and those finished.
func (l *soakLoad) counts() (inFlight, done int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, s := range l.start {
		switch {
		case s.IsZero():
		case l.end[i].IsZero():
			inFlight++
		default:
			done++
		}
	}
	return inFlight, done
}

func (l *soakLoad) during(from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i, s := range l.start {
		if !s.IsZero() && !s.After(to) && (l.end[i].IsZero() || !l.end[i].Before(from)) {
			n++
		}
	}
	return n
}

// consumerSample is one second's consumer count of every stream.
type consumerSample struct {
	at        time.Time
	lag       int // intents in flight within soakLag
	perStream map[string]int
	err       error
}

// sampleConsumers counts every stream's consumers (JetStream stream info) every second until
// ctx ends, then closes out.
func (c *chaosEnv) sampleConsumers(ctx context.Context, load *soakLoad, out chan<- []consumerSample) {
	var samples []consumerSample
	defer func() { out <- samples }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sm := consumerSample{at: time.Now()}
		sm.perStream, sm.err = c.streamConsumers(ctx)
		sm.lag = load.during(sm.at.Add(-soakLag), sm.at)
		samples = append(samples, sm)
	}
}

// streamConsumers is the consumer count of every stream.
func (c *chaosEnv) streamConsumers(ctx context.Context) (map[string]int, error) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	per := map[string]int{}
	l := c.js.ListStreams(lctx)
	for info := range l.Info() {
		per[info.Config.Name] = info.State.Consumers
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	return per, nil
}

// soakProgressEvery is how often a long soak logs how it goes (what the end-of-row checks
// cannot say: when a backlog began, and in which stream).
const soakProgressEvery = 10 * time.Second

// logProgress logs, every soakProgressEvery until ctx ends, the intents in flight and finished
// so far, every stream's messages, sequence span, interior deletes and consumers, and the
// pending and unacknowledged messages of each JOBS consumer.
func (c *chaosEnv) logProgress(ctx context.Context, load *soakLoad, start time.Time) {
	tick := time.NewTicker(soakProgressEvery)
	defer tick.Stop()
	if c.procs != nil {
		c.t.Logf("row 18: the nats-servers' profilers: %v (http://ADDR/debug/pprof/)", c.procs.ProfAddrs())
	}
	for _, n := range append(slices.Clone(c.workers), c.apis...) {
		c.t.Logf("row 18: %s's profiler: http://%s/debug/pprof/", n.name, n.pprof)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		inFlight, done := load.counts()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		line := fmt.Sprintf("row 18 +%s: %d intents in flight, %d finished; harness heap %d MiB, GC %.1f%% of its CPU;", time.Since(start).Round(time.Second),
			inFlight, done, ms.HeapAlloc>>20, 100*ms.GCCPUFraction)
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		l := c.js.ListStreams(lctx)
		for info := range l.Info() {
			st := info.State
			line += fmt.Sprintf(" %s msgs %d seq %d-%d deleted %d consumers %d;", info.Config.Name, st.Msgs, st.FirstSeq, st.LastSeq, st.NumDeleted, st.Consumers)
		}
		if err := l.Err(); err != nil {
			line += " streams: " + err.Error()
		}
		if s, err := c.js.Stream(lctx, "JOBS"); err == nil {
			cl := s.ListConsumers(lctx)
			for ci := range cl.Info() {
				line += fmt.Sprintf(" JOBS consumer %s pending %d ack-pending %d redelivered %d waiting %d;", ci.Name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting)
			}
		}
		cancel()
		c.t.Log(line)
	}
}

// soakFault is one restart the soak did.
type soakFault struct {
	kind      int // 0 a NATS server, 1 an API process, 2 a worker process
	at        time.Time
	what      string
	recovered time.Duration
}

func chaosSoakRow(t *testing.T, c *chaosEnv, s *rowStats) {
	dur, interval, rate := soakParams()
	period := time.Duration(float64(time.Second) / rate)
	n := max(1, int(dur/period))
	t.Logf("row 18: %s at %.3g intents/s (%d intents), a restart every %s (none if negative)", dur, rate, n, interval)

	// Every random choice is drawn here, on the test's goroutine, before the load starts.
	type plan struct {
		sp     *intentSpec
		copies []copyPlan
	}
	plans := make([]plan, n)
	for i := range plans {
		sp := c.newIntent(fmt.Sprintf("chaos row 18 intent %d seed %d", i, *chaosSeed),
			soakMinTokens+c.rng.IntN(soakMaxTokens-soakMinTokens+1))
		cps := make([]copyPlan, 1+c.rng.IntN(3))
		for j := range cps {
			cps[j] = copyPlan{stream: c.rng.IntN(2) == 0, node: c.rng.IntN(2)}
		}
		plans[i] = plan{sp, cps}
	}
	base, err := c.streamConsumers(context.Background())
	if err != nil {
		t.Fatalf("row 18: the streams' consumers at the baseline: %v", err)
	}

	load := &soakLoad{start: make([]time.Time, n), end: make([]time.Time, n)}
	sctx, stopSampler := context.WithCancel(context.Background())
	sampled := make(chan []consumerSample, 1)
	go c.sampleConsumers(sctx, load, sampled)
	progressDone := make(chan struct{})
	if dur >= time.Minute {
		go func() {
			defer close(progressDone)
			c.logProgress(sctx, load, time.Now())
		}()
	} else {
		close(progressDone)
	}
	var samples []consumerSample
	stopSampling := func() {
		if stopSampler != nil {
			stopSampler()
			samples, stopSampler = <-sampled, nil
			<-progressDone
		}
	}
	defer stopSampling()

	// The open-loop load: intent i is sent at start + i·period, whatever the earlier ones do.
	stop := make(chan struct{})
	var copiesWG, genWG sync.WaitGroup
	start := time.Now()
	genWG.Add(1)
	go func() {
		defer genWG.Done()
		for i, p := range plans {
			select {
			case <-stop:
				return
			case <-time.After(time.Until(start.Add(time.Duration(i) * period))):
			}
			load.mu.Lock()
			load.start[i] = time.Now()
			load.mu.Unlock()
			p.sp.invoked = load.start[i]
			var intentWG sync.WaitGroup
			for _, cp := range p.copies {
				intentWG.Add(1)
				copiesWG.Add(1)
				go func() {
					defer copiesWG.Done()
					defer intentWG.Done()
					c.sdkCopy(p.sp, cp.stream, cp.node)
				}()
			}
			copiesWG.Add(1)
			go func() {
				defer copiesWG.Done()
				intentWG.Wait()
				load.mu.Lock()
				load.end[i] = time.Now()
				load.mu.Unlock()
			}()
		}
	}()
	var stopOnce sync.Once
	halt := func() {
		stopOnce.Do(func() { close(stop) })
		genWG.Wait()
		copiesWG.Wait()
	}
	defer halt() // a failed restart ends the test here: the clients end by their deadline

	// The restarts: the first half an interval in, then one every interval, while intents
	// still arrive. A restart that took longer than the interval is followed at once.
	// The kinds come in seeded rounds of all three, so even a short soak restarts each kind.
	var faults []soakFault
	var kinds []int
	for next := start.Add(interval / 2); interval > 0 && next.Before(start.Add(dur)); next = next.Add(interval) {
		if len(kinds) == 0 {
			kinds = c.rng.Perm(3)
		}
		time.Sleep(time.Until(next))
		faults = append(faults, c.soakRestart(kinds[0]))
		kinds = kinds[1:]
		t.Logf("row 18: %s at %s, recovered in %s", faults[len(faults)-1].what,
			faults[len(faults)-1].at.Sub(start).Round(time.Millisecond), faults[len(faults)-1].recovered.Round(time.Millisecond))
	}
	genWG.Wait() // the last intents are sent
	halt()
	// The sampler goes on until every intent's consumers had their inactive threshold.
	testkit.CheckFor(t, chaosSettle, 200*time.Millisecond, func() error {
		if r := load.during(time.Now().Add(-soakRecent), time.Now()); r != 0 {
			return fmt.Errorf("%d intents ended within %s", r, soakRecent)
		}
		return nil
	})
	stopSampling()

	// I1-I5 for every intent; a worker restart may have made executions ambiguous.
	var jobIDs []string
	var successes []time.Time
	errs := map[string]int{}
	exchanges := 0
	var slowest time.Duration
	var slowestWhat string
	for _, p := range plans {
		if !slices.ContainsFunc(p.sp.copies, func(cr *copyResult) bool { return cr.final != nil }) {
			// No client got an answer: there may be no record to check (checkIntent needs one).
			var hist []string
			for _, cr := range p.sp.copies {
				for _, a := range cr.attempts {
					hist = append(hist, fmt.Sprintf("[%s +%s stream %v: %s]", c.apis[a.node].name,
						a.start.Sub(start).Round(time.Millisecond), cr.stream, describe(a)))
				}
			}
			s.intents++
			s.mismatches++
			st := send(http.MethodGet, c.apis[0].base+"/v1/idempotency/"+p.sp.key, "", nil)
			var execs []string
			for _, ex := range c.rec.of(p.sp.msg) {
				execs = append(execs, fmt.Sprintf("[worker %d +%s-+%s %d bytes completed %v]", ex.worker,
					ex.start.Sub(start).Round(time.Millisecond), ex.end.Sub(start).Round(time.Millisecond), ex.bytes, ex.completed))
			}
			s.fail(t, "row 18: intent %q: no client got an answer: %s; its record now: %d %s; its backend executions: %v",
				p.sp.key, strings.Join(hist, " "), st.Status, st.Body, execs)
			continue
		}
		if id := c.checkIntent(s, p.sp, takeoverOK); id != "" {
			jobIDs = append(jobIDs, id)
		}
		for _, cr := range p.sp.copies {
			if cr.final != nil {
				successes = append(successes, cr.done)
				if added := cr.done.Sub(cr.invoked) - p.sp.gen; added > slowest {
					slowest, slowestWhat = added, fmt.Sprintf("intent %q (stream %v) sent at %s, %d exchanges, the first %s",
						p.sp.key, cr.stream, cr.invoked.Sub(start).Round(time.Millisecond), len(cr.attempts), describe(cr.attempts[0]))
				}
			}
			for _, a := range cr.attempts {
				exchanges++
				if !a.ok(cr.stream) {
					errs[soakErrorKind(a, cr.stream)]++
				}
			}
		}
	}
	s.trials = len(faults)

	// The longest window without a successful completion while intents arrive: between two
	// successes (or the start and the first), beginning before the last intent was sent.
	sort.Slice(successes, func(i, j int) bool { return successes[i].Before(successes[j]) })
	lastSent := load.start[n-1]
	prev, at := start, start
	for _, done := range successes {
		if gap := done.Sub(prev); gap > s.longestGap && prev.Before(lastSent) {
			s.longestGap, at = gap, prev
		}
		prev = done
	}

	// The consumers: bounded by the intents in flight, never by the intents so far.
	maxPer, over, failedSamples, peakInFlight := map[string]int{}, map[string]int{}, 0, 0
	for _, sm := range samples {
		if sm.err != nil {
			failedSamples++
			continue
		}
		// A restart's orphans, for soakRecent after it: one consumer per intent the killed API
		// node followed, or whose feed ended (its delete failing) while a NATS server was down.
		// A worker holds no consumer but its lease scan's, which soakSlack covers.
		orphans := 0
		for _, f := range faults {
			if f.kind != 2 && !sm.at.Before(f.at) && sm.at.Before(f.at.Add(f.recovered+soakRecent)) {
				orphans += load.during(f.at.Add(-soakLag), f.at.Add(f.recovered))
			}
		}
		peakInFlight = max(peakInFlight, sm.lag)
		for name, got := range sm.perStream {
			maxPer[name] = max(maxPer[name], got)
			if limit := base[name] + 2*sm.lag + orphans + soakSlack; got > limit {
				if over[name]++; over[name] > 1 {
					continue // the first sample says it; the count follows
				}
				s.fail(t, "row 18: at %s stream %s held %d consumers, %d intents in flight within %s, %d in flight during a restart within %s, baseline %d: over the bound %d",
					sm.at.Sub(start).Round(time.Second), name, got, sm.lag, soakLag, orphans, soakRecent, base[name], limit)
			}
		}
	}
	if len(faults) == 0 && len(errs) > 0 {
		s.fail(t, "row 18: without restarts the clients saw errors: %s", fmtCounts(errs))
	}
	for name, n := range over {
		if n > 1 {
			s.fail(t, "row 18: stream %s was over its consumer bound in %d of %d samples", name, n, len(samples))
		}
	}
	if len(samples) == 0 || failedSamples == len(samples) {
		s.fail(t, "row 18: no consumer count was sampled (%d samples)", len(samples))
	}
	t.Logf("row 18: %d intents, %d client exchanges, %d restarts; longest window without a successful completion %s (from %s); client errors, all retried: %v",
		n, exchanges, len(faults), s.longestGap.Round(time.Millisecond), at.Sub(start).Round(time.Millisecond), fmtCounts(errs))
	t.Logf("row 18: consumers per stream, baseline %v, peak %v; %d samples (%d failed during restarts), peak intents in flight (within %s): %d",
		fmtCounts(base), fmtCounts(maxPer), len(samples), failedSamples, soakLag, peakInFlight)
	t.Logf("row 18: the slowest answer came %s after its generation's length: %s", slowest.Round(time.Millisecond), slowestWhat)
	c.finishRow(s, jobIDs)
}

// soakRestart restarts a NATS server, an API process or a worker process (kind 0, 1, 2), a
// seeded one of its kind, and waits until it serves again.
func (c *chaosEnv) soakRestart(kind int) soakFault {
	t := c.t
	t.Helper()
	f := soakFault{kind: kind, at: time.Now()}
	switch kind {
	case 0:
		i := c.rng.IntN(c.procs.Size())
		f.what = fmt.Sprintf("NATS server %d restart", i)
		c.procs.Stop(i)
		c.procs.Start(i)
		// Its replicas catch up before the next restart may take another server down: /healthz
		// says ok only once its streams and consumers are current.
		c.procs.WaitHealthy()
	case 1:
		n := c.apis[c.rng.IntN(len(c.apis))]
		f.what = n.name + " SIGKILL"
		n.p.kill(t)
		c.start(n)
	default:
		slot := c.rng.IntN(len(c.workers))
		n := c.workers[slot]
		f.what = n.name + " SIGKILL"
		n.p.kill(t)
		c.rec.fault(slot)
		c.start(n)
	}
	f.recovered = time.Since(f.at)
	return f
}

// sdkCopy is one client as an SDK behaves: it retries a connection error, a 5xx or 409/429
// (x-should-retry decides when the server sets it) and a stream that ended without [DONE],
// with the same key, on the other node, with capped exponential backoff, at most soakRetries
// times and within the intent's deadline.
func (c *chaosEnv) sdkCopy(sp *intentSpec, stream bool, node int) {
	cr := &copyResult{stream: stream, invoked: time.Now()}
	deadline := cr.invoked.Add(chaosDeadline)
	for try := 0; try <= soakRetries && time.Now().Before(deadline); try++ {
		if try > 0 {
			time.Sleep(min(soakBackoff<<(try-1), soakMaxBackoff))
		}
		a := c.exchange(sp, stream, node, nil)
		cr.attempts = append(cr.attempts, a)
		if a.ok(stream) {
			cr.final, cr.done = a.raw, a.end
			break
		}
		if !sdkRetries(a) {
			break
		}
		node = 1 - node
	}
	sp.mu.Lock()
	sp.copies = append(sp.copies, cr)
	sp.mu.Unlock()
}

// sdkRetries is the SDKs' decision on a failed exchange.
func sdkRetries(a attempt) bool {
	switch {
	case a.status == 0 || a.status == http.StatusOK: // no response, or a stream cut short
		return true
	case a.retry != "":
		return a.retry == "true"
	}
	return a.status == http.StatusConflict || a.status == http.StatusTooManyRequests || a.status >= 500
}

// soakErrorKind names a failed exchange for the error counts.
func soakErrorKind(a attempt, stream bool) string {
	switch {
	case a.status == 0:
		return "connection error"
	case a.status != http.StatusOK:
		return fmt.Sprintf("%d x-should-retry=%s", a.status, a.retry)
	case !stream:
		return "200 body cut"
	}
	if st, err := parseChatStream(trimPartialEvent(a.raw)); err == nil && st.ErrCode != "" {
		return "stream error event " + st.ErrCode
	}
	return "stream cut"
}

func fmtCounts(m map[string]int) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d", k, m[k])
	}
	return "{" + b.String() + "}"
}
