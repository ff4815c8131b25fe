package bench

import (
	"strconv"
	"sync"
	"time"
)

// tally accumulates one target's measurements over the slices of a run. Every method is safe
// for concurrent use.
type tally struct {
	mu sync.Mutex

	requests, ok int64
	errs         map[ErrorKind]int64
	errSample    map[ErrorKind]string
	idem         map[string]int64
	bytes        int64
	lat          Recorder
	ttft, ttlt   Recorder

	intents, intentsOK int64
	intentLat          Recorder
	retries            int64
	divergent          int64
	skipped            int64

	fan fanTally

	elapsed    time.Duration
	executions int64
	execErr    error
}

// fanTally is the fanout scenario's part of a tally.
type fanTally struct {
	rounds, subscribers, complete, mismatched int64
	bytes                                     int64
	chunks                                    int // the longest first-subscriber stream, in data lines
	lag, liveLag                              Recorder
}

func newTally() *tally {
	return &tally{errs: map[ErrorKind]int64{}, errSample: map[ErrorKind]string{}, idem: map[string]int64{}}
}

// addRequest records one request.
func (t *tally) addRequest(o *outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.requests++
	t.bytes += o.bytes
	if o.idem != "" {
		t.idem[o.idem]++
	}
	if o.kind != "" {
		t.errs[o.kind]++
		if _, seen := t.errSample[o.kind]; !seen {
			if o.err != nil {
				t.errSample[o.kind] = o.err.Error()
			} else {
				t.errSample[o.kind] = "HTTP " + strconv.Itoa(o.status)
			}
		}
		return
	}
	t.ok++
	t.lat.Record(o.latency)
	if o.done {
		t.ttft.Record(o.ttft)
		t.ttlt.Record(o.ttlt)
	}
}

// addIntent records one finished intent (a unit of the scenario).
func (t *tally) addIntent(ok bool, d time.Duration, divergent bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.intents++
	if ok {
		t.intentsOK++
		t.intentLat.Record(d)
	}
	if divergent {
		t.divergent++
	}
}

func (t *tally) addRetry() {
	t.mu.Lock()
	t.retries++
	t.mu.Unlock()
}

func (t *tally) addSkipped() {
	t.mu.Lock()
	t.skipped++
	t.mu.Unlock()
}

func (t *tally) addElapsed(d time.Duration) {
	t.mu.Lock()
	t.elapsed += d
	t.mu.Unlock()
}

func (t *tally) addExecutions(n int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil && t.execErr == nil {
		t.execErr = err
	}
	t.executions += n
}

// addFanout records one fanout round.
func (t *tally) addFanout(f *fanTally) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fan.rounds += f.rounds
	t.fan.subscribers += f.subscribers
	t.fan.complete += f.complete
	t.fan.mismatched += f.mismatched
	t.fan.bytes += f.bytes
	t.fan.chunks = max(t.fan.chunks, f.chunks)
	t.fan.lag.merge(&f.lag)
	t.fan.liveLag.merge(&f.liveLag)
}
