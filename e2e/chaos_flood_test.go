package e2e

// Row 10 of the fault suite (notes/reliability-matrix.md §7.2): a flood of identical
// requests, the same tenant, key and body, fired at once and split across both API nodes,
// half streamed. One claim wins (created); every other copy joins the execution or, once it
// finished, is replayed. One backend execution, one ledger posting, one transcript.

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// chaosFloodCopies is the flood's size in every mode: one trial of 1,000 copies stays within
// a short row's budget under -race.
const chaosFloodCopies = 1000

// floodTrials is one trial unless -chaos.trials or -chaos.long asks for more: a trial is
// already 1,000 requests.
func floodTrials() int {
	if *chaosTrials == 0 && !*chaosLong {
		return 1
	}
	return chaosTrialCount()
}

func chaosFlood(t *testing.T, c *chaosEnv, s *rowStats) {
	var jobIDs []string
	var creatorTTFB, followerTTFB, plainLatency []time.Duration
	for trial := range floodTrials() {
		sp := c.seededIntent("10", trial, 0)
		// Seeded placement: each copy's node and mode; half of each on each node.
		plans := make([]copyPlan, chaosFloodCopies)
		for i := range plans {
			plans[i] = copyPlan{stream: i%2 == 0, node: (i / 2) % 2}
		}
		c.rng.Shuffle(len(plans), func(i, j int) { plans[i], plans[j] = plans[j], plans[i] })

		// Each copy's time to first byte: a stream's first event (the hook), a non-stream
		// answer's end (its headers come with the whole body).
		first := make([]time.Time, len(plans))
		results := make([]*copyResult, len(plans))
		fire := make(chan struct{})
		var ready, wg sync.WaitGroup
		for i, p := range plans {
			ready.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ready.Done()
				<-fire
				hook := func(n int) bool {
					if n == 1 {
						first[i] = time.Now()
					}
					return false
				}
				results[i] = c.runCopy(sp, p.stream, p.node, hook)
			}()
		}
		ready.Wait()
		sp.invoked = time.Now()
		close(fire)
		wg.Wait()

		outcomes := map[string]int{}
		creator := -1
		var trialFollowers []time.Duration
		for i, cr := range results {
			a := cr.attempts[0]
			outcomes[a.outcome]++
			if len(cr.attempts) != 1 {
				s.fail(t, "row 10: copy %d (stream %v, %s) needed %d exchanges; the first: %s", i, cr.stream, c.apis[a.node].name, len(cr.attempts), describe(a))
			}
			if a.outcome == "created" {
				creator = i
			}
			ttfb := a.end.Sub(sp.invoked)
			if cr.stream && !first[i].IsZero() {
				ttfb = first[i].Sub(sp.invoked)
			}
			switch {
			case a.outcome == "created":
				creatorTTFB = append(creatorTTFB, ttfb)
			case cr.stream:
				followerTTFB = append(followerTTFB, ttfb)
				trialFollowers = append(trialFollowers, ttfb)
			default:
				plainLatency = append(plainLatency, ttfb)
			}
		}
		if outcomes["created"] != 1 || outcomes["created"]+outcomes["joined"]+outcomes["replayed"] != len(results) {
			s.fail(t, "row 10: the copies' Oncegate-Idempotency outcomes are %v; want exactly one created, the others joined or replayed", outcomes)
		}
		if creator >= 0 {
			cr := results[creator]
			t.Logf("row 10 trial %d: %d copies, outcomes %v; the creator was a %s copy on %s, its first byte after %s; the stream followers' first event p50 %s p99 %s",
				trial, len(results), outcomes, map[bool]string{true: "stream", false: "non-stream"}[cr.stream], c.apis[cr.attempts[0].node].name,
				creatorTTFB[len(creatorTTFB)-1].Round(time.Millisecond), pct(trialFollowers, 50), pct(trialFollowers, 99))
		}
		// I1 (one execution, no takeover), I3 (1,000 identical transcripts, each stream ending
		// with [DONE], and the replays equal), I5.
		c.checkTrial(s, []*intentSpec{sp}, func() {}, noTakeover, &jobIDs)
	}
	// An execution runs in the mode of the copy that created it: after a non-stream creator,
	// the stream followers' first event comes with the whole answer.
	t.Logf("row 10: time to first byte from the flood's start: creator p50 %s (%d trials); stream followers p50 %s p99 %s (%d); non-stream followers p50 %s p99 %s (%d)",
		pct(creatorTTFB, 50), len(creatorTTFB), pct(followerTTFB, 50), pct(followerTTFB, 99), len(followerTTFB),
		pct(plainLatency, 50), pct(plainLatency, 99), len(plainLatency))
	// I2: one ledger posting per flood.
	c.finishRow(s, jobIDs)
}

// pct is the p-th percentile of d ("-" when empty).
func pct(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "-"
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return fmt.Sprint(d[min(len(d)-1, len(d)*p/100)].Round(time.Millisecond))
}
