package jobs

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/partition"
)

// maxPendingDiscards bounds the discard queue; beyond it the oldest entries are left to the
// CHUNKS retention (MaxAge) instead.
const maxPendingDiscards = 100_000

// Discarder removes a finished execution's chunks from CHUNKS a grace period after its terminal
// chunk. By then every copy that followed the execution has read them, and later copies answer
// from the record, so keeping them for the whole CHUNKS retention (15 min) only costs memory:
// the chunks repeat what the record holds. Chunks whose worker died before discarding them stay
// until the stream's MaxAge. Schedule is safe for concurrent use; Run is the one goroutine that
// purges.
type Discarder struct {
	js    jetstream.JetStream
	grace time.Duration
	now   func() time.Time
	log   zerolog.Logger

	mu      sync.Mutex
	pending []pendingDiscard // due times ascending (one grace for all)
	wake    chan struct{}
}

type pendingDiscard struct {
	subject string
	due     time.Time
}

// NewDiscarder discards chunk subjects grace after they are scheduled.
func NewDiscarder(js jetstream.JetStream, grace time.Duration, log zerolog.Logger) *Discarder {
	return &Discarder{js: js, grace: grace, now: time.Now, log: log, wake: make(chan struct{}, 1)}
}

// Schedule discards subject's chunks after the grace period.
func (d *Discarder) Schedule(subject string) {
	d.mu.Lock()
	if len(d.pending) >= maxPendingDiscards {
		d.pending = d.pending[1:]
	}
	d.pending = append(d.pending, pendingDiscard{subject: subject, due: d.now().Add(d.grace)})
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Pending is the number of subjects waiting for their grace to pass (for tests and metrics).
func (d *Discarder) Pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending)
}

// Run purges due subjects until ctx ends; what is still pending then is left to MaxAge.
func (d *Discarder) Run(ctx context.Context) {
	streams := map[partition.P]jetstream.Stream{} // CHUNKS of each partition, as looked up
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, wait := d.takeDue()
		for _, subject := range due {
			p := partition.OfSubject(subject)
			stream := streams[p]
			if stream == nil {
				s, err := d.js.Stream(ctx, ChunksStreamOf(p))
				if err != nil {
					d.log.Debug().Err(err).Msg("chunk discard: stream lookup failed; chunks left to the retention")
					break
				}
				streams[p], stream = s, s
			}
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil && ctx.Err() == nil {
				d.log.Debug().Err(err).Str("subject", subject).Msg("chunk discard failed; chunks left to the retention")
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// takeDue removes and returns the subjects that are due, and how long until the next one is.
func (d *Discarder) takeDue() ([]string, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	n := 0
	for n < len(d.pending) && !d.pending[n].due.After(now) {
		n++
	}
	due := make([]string, n)
	for i := range due {
		due[i] = d.pending[i].subject
	}
	d.pending = d.pending[n:]
	if len(d.pending) == 0 {
		d.pending = nil // let the backing array go
		return due, time.Hour
	}
	return due, d.pending[0].due.Sub(now)
}
