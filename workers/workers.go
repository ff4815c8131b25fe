// Package workers pulls jobs from the JOBS work queue and executes them: it checks the job
// against its idempotency record (the fencing token), holds and renews the record's lease while
// the backend call runs, publishes the output as chunks, writes the outcome to the record, and
// only then publishes the terminal chunk and acks the job.
//
// A Pool owns every goroutine it starts; Run returns after all of them ended.
package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/lease"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// Backend is what a worker needs from a provider adapter.
type Backend interface {
	// ChatCompletions sends one request; the caller closes the body and calls cancel.
	ChatCompletions(ctx context.Context, body []byte, stream bool) (*http.Response, context.CancelFunc, error)
}

// ConsumerName is the durable pull consumer every worker shares.
const ConsumerName = "workers"

// Options configures a Pool.
type Options struct {
	// ID names this worker process in records and logs.
	ID string
	// Concurrency bounds the backend calls in flight.
	Concurrency int
	// Lease is how long a record stays ours without renewal; RenewEvery is the renewal period.
	Lease, RenewEvery time.Duration
	// ShutdownGrace bounds how long Run waits for in-flight jobs after its ctx ends.
	ShutdownGrace time.Duration
	// Backends by configured name.
	Backends map[string]Backend
	Log      zerolog.Logger
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
}

// Pool runs jobs.
type Pool struct {
	js    jetstream.JetStream
	store *kv.Store
	opts  Options
}

// New makes a Pool.
func New(js jetstream.JetStream, store *kv.Store, opts Options) *Pool {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 64
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 10 * time.Second
	}
	return &Pool{js: js, store: store, opts: opts}
}

// EnsureConsumer creates or updates the shared durable consumer.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, lease time.Duration, maxAckPending int) (jetstream.Consumer, error) {
	c, err := js.CreateOrUpdateConsumer(ctx, jobs.JobsStream, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       lease,
		MaxAckPending: maxAckPending,
		FilterSubject: jobs.JobsSubject,
	})
	if err != nil {
		return nil, fmt.Errorf("workers: ensure consumer: %w", err)
	}
	return c, nil
}

// Run consumes jobs until ctx ends, then waits up to ShutdownGrace for in-flight jobs before
// cancelling them (their leases lapse and another worker takes them over).
func (p *Pool) Run(ctx context.Context) error {
	cons, err := EnsureConsumer(ctx, p.js, p.opts.Lease, p.opts.Concurrency*4)
	if err != nil {
		return err
	}
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()
	sem := make(chan struct{}, p.opts.Concurrency)
	var wg sync.WaitGroup
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			_ = m.Nak()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p.handle(jobCtx, m)
		}()
	}, jetstream.PullMaxMessages(p.opts.Concurrency))
	if err != nil {
		return fmt.Errorf("workers: consume: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(p.opts.ShutdownGrace):
		p.opts.Log.Warn().Msg("shutdown grace over; cancelling in-flight jobs")
		cancelJobs()
		<-done
	}
	return nil
}

// handle runs one delivered job message.
func (p *Pool) handle(ctx context.Context, m jetstream.Msg) {
	job, err := jobs.Decode(m.Data())
	if err != nil {
		p.opts.Log.Error().Err(err).Msg("terminating undecodable job")
		_ = m.Term()
		return
	}
	log := p.opts.Log.With().Str(fieldJobID, job.ID).Str(fieldKey, job.Key).Int(fieldEpoch, job.Epoch).Logger()
	rec, rev, err := p.store.Get(ctx, job.Key)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		log.Info().Msg("record gone; dropping job")
		_ = m.Ack()
		return
	case err != nil:
		log.Warn().Err(err).Msg("reading record; will retry")
		_ = m.NakWithDelay(time.Second)
		return
	}
	if rec.JobID != job.ID || rec.Epoch != job.Epoch || rec.State != kv.Pending || rec.Cancelled {
		log.Debug().Str("state", string(rec.State)).Int("record_epoch", rec.Epoch).Msg("stale job; dropping")
		_ = m.Ack()
		return
	}
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		// A redelivery: the previous holder stopped acking. Take over only once its lease ran out.
		now := p.opts.Now()
		if !rec.LeaseExpired(now) {
			_ = m.NakWithDelay(rec.LeaseUntil.Sub(now) + 100*time.Millisecond)
			return
		}
		job, rec, rev, err = lease.TakeOver(ctx, p.js, p.store, job.Key, rec, rev, now, p.opts.Lease)
		if err != nil {
			log.Info().Err(err).Msg("takeover lost; dropping job")
			_ = m.Ack()
			return
		}
		log = log.With().Int(fieldEpoch, job.Epoch).Logger()
		log.Warn().Msg("took over execution after lease expiry")
	}
	ex := &execution{pool: p, job: job, msg: m, rec: rec, rev: rev, log: log}
	ex.run(ctx)
}

// Log field names.
const (
	fieldJobID = "job_id"
	fieldKey   = "idem_key_hash"
	fieldEpoch = "epoch"
)
