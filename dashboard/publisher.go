package dashboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/telemetry"
)

// PostEvery is how often a process posts its snapshot.
const PostEvery = time.Second

// Sources are where a process's snapshot comes from; any may be nil (a role without it).
type Sources struct {
	Node  string
	Roles string
	// Server is the NATS server the process runs embedded (its cluster name), if any.
	Server string
	// Tally is the API's per-tenant outcomes; Metrics the process's money counters.
	Tally   *Tally
	Metrics *telemetry.Metrics
	// Executions are the executions the workers run, the first max of total.
	Executions func(max int) (rows []Execution, total int)
	// Follows are the copies following executions on this API process, the first max of total.
	Follows  func(max int) (rows []Follow, total int)
	Backends func() []Backend
	// Events are the latest failures and takeovers, newest first, at most max.
	Events func(max int) []Event
}

// Publisher posts this process's snapshot every PostEvery.
type Publisher struct {
	open func(context.Context) (jetstream.KeyValue, error)
	src  Sources
	log  zerolog.Logger
	now  func() time.Time
	// started is when the publisher was made, as the counters it reads began about then.
	started time.Time

	// day and base make Money's spend "today": the spend counters' values when the UTC day
	// began (0 for a process that started today).
	day  string
	base map[[2]string]int64
}

// NewPublisher posts src's snapshot into the bucket open opens (again after a failed post).
func NewPublisher(open func(context.Context) (jetstream.KeyValue, error), src Sources, log zerolog.Logger) *Publisher {
	return &Publisher{open: open, src: src, log: log, now: time.Now, started: time.Now().UTC(), base: map[[2]string]int64{}}
}

// Run posts until ctx ends, then removes the process's snapshot (so it leaves the cluster's
// dashboards at once rather than when it expires).
func (p *Publisher) Run(ctx context.Context) {
	var kv jetstream.KeyValue
	// One key per publisher, not per name: two gateways in one process (tests) share a name.
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	key := nodeKey(p.src.Node) + "_" + hex.EncodeToString(suffix[:])
	t := time.NewTicker(PostEvery)
	defer t.Stop()
	for {
		if kv == nil {
			var err error
			if kv, err = p.open(ctx); err != nil && ctx.Err() == nil {
				p.log.Debug().Err(err).Msg("dashboard: opening the snapshot bucket")
			}
		}
		if kv != nil {
			data, err := json.Marshal(p.Snapshot())
			if err == nil {
				pctx, cancel := context.WithTimeout(ctx, PostEvery)
				_, err = kv.Put(pctx, key, data)
				cancel()
			}
			if err != nil && ctx.Err() == nil {
				p.log.Debug().Err(err).Msg("dashboard: posting the snapshot")
				kv = nil // reopen: a NATS restart may have lost the memory bucket
			}
		}
		select {
		case <-ctx.Done():
			if kv != nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				_ = kv.Delete(rctx, key)
				cancel()
			}
			return
		case <-t.C:
		}
	}
}

// Snapshot is the process's part now, its rows capped. Run calls it; it is not for concurrent
// use (the day's spend base is Run's).
func (p *Publisher) Snapshot() Snapshot {
	now := p.now().UTC()
	s := Snapshot{Node: p.src.Node, Roles: p.src.Roles, At: now, Started: p.started}
	s.Counts = p.src.Tally.counts(p.src.Metrics.Reversals())
	s.Money = p.money(now, p.src.Metrics.MoneyRows())
	if p.src.Executions != nil {
		s.Executions, s.ExecutionsTotal = p.src.Executions(MaxExecutions)
		for i := range s.Executions {
			s.Executions[i].Node = p.src.Server
		}
	}
	if p.src.Follows != nil {
		s.Follows, s.FollowsTotal = p.src.Follows(MaxFollows)
	}
	if p.src.Backends != nil {
		s.Backends = p.src.Backends()
	}
	if p.src.Events != nil {
		s.Events = p.src.Events(MaxEvents)
	}
	return s
}

// money is rows with the spend since the UTC day began, sorted and capped at MaxMoneyRows.
func (p *Publisher) money(now time.Time, rows []telemetry.MoneyRow) []Money {
	day := now.Format(time.DateOnly)
	if p.day != "" && p.day != day {
		clear(p.base)
		for _, r := range rows {
			p.base[[2]string{r.Tenant, r.Model}] = r.SpendMicros
		}
	}
	p.day = day
	out := make([]Money, 0, len(rows))
	for _, r := range rows {
		out = append(out, Money{Tenant: r.Tenant, Model: r.Model, SpendMicros: r.SpendMicros - p.base[[2]string{r.Tenant, r.Model}],
			Joined: r.Joined, Replayed: r.Replayed, SavedMicros: r.SavedMicros})
	}
	slices.SortFunc(out, func(a, b Money) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return strings.Compare(a.Model, b.Model)
	})
	if len(out) > MaxMoneyRows {
		out = out[:MaxMoneyRows]
	}
	return out
}
