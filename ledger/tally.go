package ledger

// The tally of executions avoided: copies of an intent that reached no backend (they joined a
// live execution or replayed a stored answer). They are not ledger entries (nothing is
// charged), but a bill shows them next to the money, so they must outlive the process that
// counted them: each process counts them in memory and flushes the counts to OG_TALLY.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// TallyStreamName is the stream of tally reports.
const TallyStreamName = "OG_TALLY"

// tallySubjectPrefix starts every tenant's tally subject; allTallySubjects matches them all.
const (
	tallySubjectPrefix = "og.tally."
	allTallySubjects   = "og.tally.>"
)

// Tally defaults.
const (
	// DefaultTallyEvery is how often a Tally flushes when TallyOptions.Every is 0.
	DefaultTallyEvery = 10 * time.Second
	// DefaultTallyMaxKeys bounds the (tenant, model) counters a Tally holds when
	// TallyOptions.MaxKeys is 0; past it, a tenant's new models count under TallyOtherModel.
	DefaultTallyMaxKeys = 4096
	// tallyPublishTimeout bounds one report's publish (and Run's last flush).
	tallyPublishTimeout = 5 * time.Second
)

// TallyOtherModel is the model that counts a tenant's avoided executions once a Tally holds
// MaxKeys counters (model names can come from clients when a catch-all backend serves them).
const TallyOtherModel = "other"

// TallySubject is the tally subject of tenant: the token of its ledger subject (a hash, never
// the tenant's text).
func TallySubject(tenant string) string {
	return tallySubjectPrefix + strings.TrimPrefix(Subject(tenant), subjectPrefix)
}

// TallyStreamConfig is the configuration EnsureTally creates OG_TALLY with: a file stream like
// LEDGER (deletes and purges denied, discard new, no age or per-subject limit, a Nats-Msg-Id
// window of DuplicateWindow), with one replica that EnsureTally raises.
func TallyStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              TallyStreamName,
		Description:       "oncegate executions avoided (joins and replays), one report per tenant per flush of each process",
		Subjects:          []string{allTallySubjects},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Discard:           jetstream.DiscardNew,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		Duplicates:        DuplicateWindow,
		DenyDelete:        true,
		DenyPurge:         true,
		Replicas:          1,
	}
}

// EnsureTally creates OG_TALLY with n replicas, or raises an existing one's replicas to n (it
// never lowers them) and puts back its subjects; other settings of an existing stream are
// kept. It updates the stream only when something must change. A memory OG_TALLY is an
// ErrStreamConfig; a replica count NATS refuses is a replicas.ErrReplicas.
func EnsureTally(ctx context.Context, js jetstream.JetStream, n int) error {
	want := TallyStreamConfig()
	want.Replicas = max(n, 1)
	return ensureStream(ctx, js, want, func(cur jetstream.StreamConfig) (jetstream.StreamConfig, error) {
		if cur.Storage != jetstream.FileStorage {
			return cur, fmt.Errorf("%w: %s uses %s storage; the tally needs file storage (recreate it)", ErrStreamConfig, TallyStreamName, cur.Storage)
		}
		next := cur
		next.Subjects = slices.Clone(cur.Subjects)
		if !slices.Contains(next.Subjects, allTallySubjects) {
			next.Subjects = append(next.Subjects, allTallySubjects)
		}
		return next, nil
	})
}

// TallyReport is one OG_TALLY message: what one process counted for one tenant in the
// interval [From, To) of its clock. ID (node and sequence) names the report: it is the
// message's Nats-Msg-Id, and readers count a report once per ID.
type TallyReport struct {
	ID     string        `json:"id"`
	Tenant string        `json:"tenant"`
	From   time.Time     `json:"from"`
	To     time.Time     `json:"to"`
	Models []TallyCounts `json:"models"` // sorted by model
}

// TallyCounts is one model's executions avoided in a report, and the money they saved
// (priced from the avoided execution's usage, in micro-units).
type TallyCounts struct {
	Model       string `json:"model"`
	Joined      int    `json:"joined"`
	Replayed    int    `json:"replayed"`
	SavedMicros int64  `json:"saved_micros"`
}

// TallyOptions configure a Tally.
type TallyOptions struct {
	// Node names the process in report ids (a random suffix makes each Tally's ids its own,
	// across restarts of a process that keeps its name).
	Node string
	// Every is the flush interval (0: DefaultTallyEvery).
	Every time.Duration
	// MaxKeys bounds the (tenant, model) counters (0: DefaultTallyMaxKeys).
	MaxKeys int
	Log     zerolog.Logger
	// Now is the clock of the reports' intervals (time.Now when nil).
	Now func() time.Time
}

// Tally counts a process's executions avoided per tenant and model in memory and flushes them
// to OG_TALLY: every Every (Run), and once more when Run stops.
//
// Each flush freezes, for every tenant with counts and no report still unsent, a report of
// the counts since the tenant's last report and publishes it with its own Nats-Msg-Id; a
// report whose publish failed is kept, unchanged (same id, same interval), and published
// again on the next flush, while new counts keep adding up for the report after it. So a
// failed publish never loses a count, a retried one that had in fact been stored is dropped by
// the stream's duplicate window or, later than that, by the reader (it counts an id once),
// and memory stays bounded: one unsent report per tenant, MaxKeys counters.
//
// A crash (SIGKILL, power loss) loses what was counted since the last successful flush of the
// process: at most one interval's counts (more while publishes fail). A clean stop (Run's
// context ends) flushes first.
//
// A Tally is safe for concurrent use. Avoided takes a mutex and looks a map up: it allocates
// only for a (tenant, model) it has not counted since its counter was last dropped (a counter
// is dropped after a flush interval without counts). No method starts a goroutine; Run is
// the flusher, and its caller owns it.
type Tally struct {
	js      jetstream.JetStream
	node    string
	every   time.Duration
	maxKeys int
	log     zerolog.Logger
	now     func() time.Time

	mu     sync.Mutex
	counts map[tallyKey]*tallyCell
	// since is when each tenant's next report starts (the end of its last one).
	since map[string]time.Time
	start time.Time

	// flushMu serializes flushes; pending and seq are theirs.
	flushMu sync.Mutex
	pending map[string]*TallyReport // by tenant: frozen, not yet stored
	seq     uint64
}

type tallyKey struct{ tenant, model string }

type tallyCell struct {
	joined, replayed int
	saved            int64
	// idle: no count since the last flush (a second idle flush drops the cell).
	idle bool
}

// NewTally returns a Tally that publishes on js. Create OG_TALLY with EnsureTally first.
func NewTally(js jetstream.JetStream, opts TallyOptions) *Tally {
	var r [6]byte
	_, _ = rand.Read(r[:])
	t := &Tally{js: js, node: opts.Node + "-" + hex.EncodeToString(r[:]), every: opts.Every, maxKeys: opts.MaxKeys,
		log: opts.Log.With().Str("component", "tally").Logger(), now: opts.Now,
		counts: map[tallyKey]*tallyCell{}, since: map[string]time.Time{}, pending: map[string]*TallyReport{}}
	if t.every <= 0 {
		t.every = DefaultTallyEvery
	}
	if t.maxKeys <= 0 {
		t.maxKeys = DefaultTallyMaxKeys
	}
	if t.now == nil {
		t.now = time.Now
	}
	t.start = t.now().UTC()
	return t
}

// Avoided counts one execution avoided for tenant's model: joined (else replayed), and the
// micro-units it saved. Safe on a nil Tally (counts nothing).
func (t *Tally) Avoided(tenant, model string, joined bool, savedMicros int64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.counts[tallyKey{tenant, model}]
	if c == nil {
		k := tallyKey{tenant, model}
		if len(t.counts) >= t.maxKeys {
			k.model = TallyOtherModel
			c = t.counts[k]
		}
		if c == nil {
			c = &tallyCell{}
			k.tenant, k.model = strings.Clone(k.tenant), strings.Clone(k.model) // kept: copy
			t.counts[k] = c
		}
	}
	if joined {
		c.joined++
	} else {
		c.replayed++
	}
	c.saved += max(savedMicros, 0)
	c.idle = false
}

// Run flushes every interval until ctx ends, then flushes once more (within a few seconds,
// on a context of its own) and returns that flush's error: nil when every count was stored.
func (t *Tally) Run(ctx context.Context) error {
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tallyPublishTimeout)
			defer cancel()
			err := t.Flush(fctx)
			if err != nil {
				t.log.Error().Err(err).Msg("the last tally flush failed: these executions avoided are not in the bills")
			}
			return err
		case <-tick.C:
			if err := t.Flush(ctx); err != nil && ctx.Err() == nil {
				t.log.Warn().Err(err).Msg("tally flush failed: the counts are kept for the next one")
			}
		}
	}
}

// Flush publishes the reports unsent by earlier flushes, then one report per tenant of the
// counts since its last report (a tenant whose earlier report is still unsent keeps its new
// counts for the next flush). A report that fails stays, unchanged, for the next flush; the
// error joins every failure.
func (t *Tally) Flush(ctx context.Context) error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	err := t.send(ctx, slices.Sorted(maps.Keys(t.pending)))
	return errors.Join(err, t.send(ctx, t.freeze()))
}

// send publishes the pending reports of tenants, dropping those stored.
func (t *Tally) send(ctx context.Context, tenants []string) error {
	var errs []error
	for _, tenant := range tenants {
		r := t.pending[tenant]
		if err := t.publish(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("ledger: tally report %s: %w", r.ID, err))
			continue
		}
		delete(t.pending, tenant)
	}
	return errors.Join(errs...)
}

// freeze moves the counts of every tenant without an unsent report into a new pending report,
// and returns those tenants, sorted.
func (t *Tally) freeze() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now().UTC()
	fresh := map[string]*TallyReport{}
	for k, c := range t.counts {
		if c.idle {
			delete(t.counts, k)
			continue
		}
		if _, unsent := t.pending[k.tenant]; unsent {
			continue
		}
		r := fresh[k.tenant]
		if r == nil {
			from, ok := t.since[k.tenant]
			if !ok {
				from = t.start
			}
			r = &TallyReport{Tenant: k.tenant, From: from, To: now}
			fresh[k.tenant] = r
		}
		r.Models = append(r.Models, TallyCounts{Model: k.model, Joined: c.joined, Replayed: c.replayed, SavedMicros: c.saved})
		*c = tallyCell{idle: true}
	}
	tenants := slices.Sorted(maps.Keys(fresh))
	for _, tenant := range tenants {
		r := fresh[tenant]
		slices.SortFunc(r.Models, func(a, b TallyCounts) int { return strings.Compare(a.Model, b.Model) })
		t.seq++
		r.ID = fmt.Sprintf("tally.%s.%d", t.node, t.seq)
		t.pending[tenant] = r
		t.since[tenant] = now
	}
	return tenants
}

func (t *Tally) publish(ctx context.Context, r *TallyReport) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, tallyPublishTimeout)
	defer cancel()
	msg := &nats.Msg{Subject: TallySubject(r.Tenant), Data: data, Header: nats.Header{}}
	_, err = t.js.PublishMsg(pctx, msg, jetstream.WithMsgID(r.ID))
	return err
}

// inPeriod: t is in [from, to), a zero bound being open.
func inPeriod(t, from, to time.Time) bool {
	return (from.IsZero() || !t.Before(from)) && (to.IsZero() || t.Before(to))
}

// Tallies returns the tally reports of tenant ("" = every tenant) whose interval ends in
// [from, to) (a zero bound is open), each id once, in stream order. Without OG_TALLY there are
// none. It reads the reports stored since from less a minute (a report is published after its
// interval ends; the minute allows for clocks), to the stream's end.
func (l *Ledger) Tallies(ctx context.Context, tenant string, from, to time.Time) ([]TallyReport, error) {
	st, err := l.js.Stream(ctx, TallyStreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ledger: stream %s: %w", TallyStreamName, err)
	}
	subject := allTallySubjects
	if tenant != "" {
		subject = TallySubject(tenant)
	}
	var sp span
	if !from.IsZero() {
		sp.since = from.Add(-time.Minute)
	}
	seen := map[string]bool{}
	var out []TallyReport
	err = l.scanStream(ctx, st, subject, sp, func(data []byte, seq uint64) error {
		var r TallyReport
		if err := json.Unmarshal(data, &r); err != nil || r.ID == "" {
			return fmt.Errorf("%w: %s seq %d is not a tally report", ErrCorrupt, TallyStreamName, seq)
		}
		if (tenant != "" && r.Tenant != tenant) || seen[r.ID] || !inPeriod(r.To, from, to) {
			return nil
		}
		seen[r.ID] = true
		out = append(out, r)
		return nil
	})
	return out, err
}
