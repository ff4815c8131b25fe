package kv

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// BillableWindow is how far back the first read of a LeaseWatch (a process start) keeps the
// finished records it finds for Billable: a crash between an outcome and its charge is
// repaired by the next process's sweep if it restarts within it. Older records were charged
// or seen by an earlier sweep; reading the whole TTL's would queue every record of a day.
// It is shorter than the ledger's id index (the gateway's dedupHorizon, 10 minutes) by more
// than the ledger's one-minute margin for clocks, so a restarted sweep's repeat charges are
// decided from the index: at 10 minutes, each charge of a 9-10 minute old record read a
// minute of the tenant's entries from the stream (row 18's soak, after a worker restart).
const BillableWindow = 8 * time.Minute

// maxBillable bounds the billable records a LeaseWatch holds until Billable takes them (at
// ~200 B each with the map, 20 MB): at 1,000 requests a second, a grace of 30 s and a sweep
// every 5 s, about a third of it.
const maxBillable = 100_000

// Finished is a finished record with something to charge (Record.Billable), found by a
// LeaseWatch among the records written since its last read.
type Finished struct {
	Key     string
	Rev     uint64
	Written time.Time
	// Worker is the pool that stored the outcome and charges it ("" when no pool's execution
	// did: a takeover's or a cancel's record).
	Worker string
}

func (w *LeaseWatch) noteBillable(key string, written time.Time, rev uint64, worker string) {
	if written.Before(w.billSince) {
		return
	}
	if _, ok := w.billable[key]; !ok && len(w.billable) >= maxBillable {
		w.billDropped++
		return
	}
	w.billable[key] = Finished{Key: key, Rev: rev, Written: written, Worker: worker}
}

// Billable takes the billable finished records that the last Expired read and that were
// written before cutoff (the later ones are kept for a later call), oldest first, and how
// many were not kept since the last call because too many were waiting (each one a charge
// only a redelivery can still repair: log it). A record is returned once per write.
func (w *LeaseWatch) Billable(cutoff time.Time) (due []Finished, dropped int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, f := range w.billable {
		if f.Written.Before(cutoff) {
			due = append(due, f)
			delete(w.billable, key)
		}
	}
	dropped, w.billDropped = w.billDropped, 0
	slices.SortFunc(due, func(a, b Finished) int {
		return cmp.Or(a.Written.Compare(b.Written), strings.Compare(a.Key, b.Key))
	})
	return due, dropped
}

// Requeue gives f back to the watch, for the next Billable call (its charge failed). A newer
// record of the same key, already noted, wins.
func (w *LeaseWatch) Requeue(f Finished) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cur, ok := w.billable[f.Key]; ok && cur.Rev > f.Rev {
		return
	}
	if _, ok := w.billable[f.Key]; !ok && len(w.billable) >= maxBillable {
		w.billDropped++
		return
	}
	w.billable[f.Key] = f
}
