package cold

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/replicas"
)

// Stream is the cold tier's stream (partition 0's; partition k's is OG_COLD_P<k>, with its
// subjects under "p<k>.": Config.Partition).
const Stream = "OG_COLD"

// Subjects: records on recSubject.<unix hour of the write>, the mover's marks on markSubject
// (partition 0's; a partition's are partition.P.Subject of them).
const (
	recSubject  = "og.cold.r"
	markSubject = "og.cold.mark"
)

// Headers of a record's copy.
const (
	hdrKey     = "Og-Cold-Key"
	hdrRev     = "Og-Cold-Rev"
	hdrWritten = "Og-Cold-Written" // unix nanoseconds, the IDEM message's stored time
	hdrOp      = "Og-Cold-Op"      // "del" on a tombstone (a delete or purge)
)

// dupWindow is how long OG_COLD remembers a copy's Nats-Msg-Id: long enough for movers
// racing over one batch (a round takes well under it), short because the server keeps an
// entry per copy for it (about 150 B each: at the default 2 min, 18 MB at 1,000 intents/s).
const dupWindow = 20 * time.Second

// Sentinel errors.
var (
	// ErrBehind is returned by Ready when this node's index has not applied the cold tier up
	// to where a key missing from the hot tier could be: it may not answer "new". It is a
	// jsretry.ErrUnavailable (503 store_unavailable, Retry-After): nothing was decided.
	ErrBehind = fmt.Errorf("cold: this node's cold index is behind the hot tier's expiry: %w", jsretry.ErrUnavailable)
	// ErrNotFound is returned by Read when the record is no longer in OG_COLD (past its TTL).
	ErrNotFound = errors.New("cold: record not found")
)

// Config configures a Tier.
type Config struct {
	// HotTTL is the hot bucket's MaxAge, TTL the keys' whole retention (HotTTL < TTL).
	HotTTL, TTL time.Duration
	// Source is the hot bucket's stream (KV_IDEM) and Prefix its keys' subject prefix
	// ("$KV.IDEM.").
	Source, Prefix string
	// Replicas of OG_COLD (0 or 1: one).
	Replicas int
	// Dir holds the local index ("": in memory, rebuilt from OG_COLD at every start).
	Dir string
	// MoveAfter is the age at which a hot message is copied (0: HotTTL/2); Margin the slack
	// Ready keeps (0: HotTTL/4); Every the mover's period (0: HotTTL/16, at most 5 s).
	MoveAfter, Margin, Every time.Duration
	Log                      zerolog.Logger
	// Node names this node's mover in its marks ("": a random name).
	Node string
	// Partition is the partition whose hot bucket Source is: its copies go to its own OG_COLD
	// (partition.P.Stream), placed by Placement when set (the partition's own servers).
	Partition partition.P
	Placement *jetstream.Placement
}

func (c *Config) defaults() {
	if c.MoveAfter <= 0 {
		c.MoveAfter = c.HotTTL / 2
	}
	if c.Margin <= 0 {
		c.Margin = c.HotTTL / 4
	}
	if c.Every <= 0 {
		c.Every = min(c.HotTTL/16, 5*time.Second)
	}
	if c.Node == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		c.Node = hex.EncodeToString(b[:])
	}
}

// Tier is one node's view of the cold tier.
type Tier struct {
	cfg    Config
	js     jetstream.JetStream
	stream jetstream.Stream
	// name is the partition's OG_COLD, rec and mark its record subjects' prefix and its mark
	// subject.
	name, rec, mark string
	ix              *index
	// watermark is the applied mark's W in unix ns: every hot message written before it is
	// in this node's index.
	watermark atomic.Int64
	applied   atomic.Uint64
	// first is the mover's last read of the first hot message after its mark (the mover's).
	first firstAfter
	// expired is the index span before which the index has dropped its entries (the applier's).
	expired uint32
	closed  sync.Once
}

// Open creates or updates OG_COLD and opens this node's index, rebuilding it from the start
// of OG_COLD when it is missing or unreadable, or holds more than the stream (recreated).
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Tier, error) {
	cfg.defaults()
	name, rec, mk := cfg.Partition.Stream(Stream), cfg.Partition.Subject(recSubject), cfg.Partition.Subject(markSubject)
	st, err := EnsureStream(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	ix, rebuilt, err := openIndex(cfg.Dir, cfg.TTL)
	if err != nil {
		return nil, err
	}
	t := &Tier{cfg: cfg, js: js, stream: st, ix: ix, name: name, rec: rec, mark: mk}
	applied, wm, err := ix.state()
	if err != nil {
		_ = ix.close()
		return nil, err
	}
	if last := st.CachedInfo().State.LastSeq; applied > last {
		cfg.Log.Warn().Uint64("applied", applied).Uint64("last", last).Msg("cold index ahead of OG_COLD (recreated?): rebuilding it")
		if err := ix.wipe(); err != nil {
			_ = ix.close()
			return nil, err
		}
		applied, wm, rebuilt = 0, time.Time{}, true
	}
	if rebuilt {
		cfg.Log.Info().Str("dir", cfg.Dir).Msg("cold index rebuilt from OG_COLD")
	}
	t.applied.Store(applied)
	if !wm.IsZero() {
		t.watermark.Store(wm.UnixNano())
	}
	return t, nil
}

// EnsureStream creates or updates the partition's OG_COLD (cfg's TTL, Replicas, Partition and
// Placement): a node's start makes it with its other streams, so that nodes starting together
// race in the setup's retries, not in Open.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	name, rec, mk := cfg.Partition.Stream(Stream), cfg.Partition.Subject(recSubject), cfg.Partition.Subject(markSubject)
	st, err := replicas.Ensure(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{rec + ".*", mk},
		Storage: jetstream.FileStorage, MaxAge: cfg.TTL, Replicas: max(cfg.Replicas, 1), AllowDirect: true,
		Duplicates: dupWindow, Discard: jetstream.DiscardOld, Placement: cfg.Placement})
	if err != nil {
		return nil, fmt.Errorf("cold: open stream %s: %w", name, err)
	}
	return st, nil
}

// Close closes the index; Run must have returned.
func (t *Tier) Close() error {
	var err error
	t.closed.Do(func() { err = t.ix.close() })
	return err
}

// Watermark is the W of the last mark this node applied: every hot message written before
// it is in the local index. Zero before the first.
func (t *Tier) Watermark() time.Time {
	w := t.watermark.Load()
	if w == 0 {
		return time.Time{}
	}
	return time.Unix(0, w)
}

// Ready is nil when the local index may answer that a key missing from the hot tier is new at
// now: its watermark is no older than now - HotTTL + Margin. Else ErrBehind.
func (t *Tier) Ready(now time.Time) error {
	if t.Watermark().Before(now.Add(-t.cfg.HotTTL + t.cfg.Margin)) {
		return ErrBehind
	}
	return nil
}

// Hit is a key's newest copy in the cold tier.
type Hit struct {
	Seq, Rev uint64
	Written  time.Time
	pos      uint32 // in its pack
}

// Lookup finds key in the local index at now, without any NATS request: ok is false when it
// has no copy, its copy is a tombstone, or its copy is past the TTL. A miss means "new" only
// when Ready is nil.
func (t *Tier) Lookup(key string, now time.Time) (Hit, bool, error) {
	from := now.Add(-t.cfg.TTL)
	e, ok, err := t.ix.lookup(key, from, now.Add(maxSkew))
	if err != nil || !ok || e.op == opDel || !e.written.After(from) {
		return Hit{}, false, err
	}
	return Hit{Seq: e.seq, Rev: e.rev, Written: e.written, pos: e.pos}, true, nil
}

// Read fetches the stored record of key at h from OG_COLD (a direct get, any replica).
func (t *Tier) Read(ctx context.Context, key string, h Hit) ([]byte, error) {
	var data []byte
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		m, err := t.stream.GetMsg(ctx, h.Seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		records, err := copiedRecords(m.Header, m.Data)
		if err != nil {
			return fmt.Errorf("cold: OG_COLD %d: %w", h.Seq, err)
		}
		if int(h.pos) >= len(records) || records[h.pos].key != key || records[h.pos].rev != h.Rev {
			return fmt.Errorf("cold: OG_COLD %d holds another key at %d", h.Seq, h.pos)
		}
		data = records[h.pos].data
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cold: read %s at %d: %w", key, h.Seq, err)
	}
	return data, nil
}

// Records is how many record copies (tombstones included, marks not) OG_COLD holds. It reads
// the whole stream: for tests and small benchmarks.
func (t *Tier) Records(ctx context.Context) (uint64, error) {
	info, err := t.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("cold: %s info: %w", t.name, err)
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	cons, err := t.js.OrderedConsumer(ctx, t.name, jetstream.OrderedConsumerConfig{FilterSubjects: []string{t.rec + ".>"}})
	if err != nil {
		return 0, fmt.Errorf("cold: %s: %w", t.name, err)
	}
	var n uint64
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return 0, fmt.Errorf("cold: read %s: %w", t.name, err)
		}
		records, err := copiedRecords(msg.Headers(), msg.Data())
		if err != nil {
			return 0, err
		}
		n += uint64(len(records))
		meta, err := msg.Metadata()
		if err != nil {
			return 0, err
		}
		if meta.NumPending == 0 {
			return n, nil
		}
	}
}

// Run moves and applies until ctx ends.
func (t *Tier) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		t.runMover(ctx)
	}()
	go func() {
		defer wg.Done()
		t.runApplier(ctx)
	}()
	wg.Wait()
}

// mark is the mover's watermark message: every hot message up to Seq, and every one stored
// before W (unix ns), is in OG_COLD before this mark.
type mark struct {
	Seq uint64 `json:"seq"`
	W   int64  `json:"w"`
	// Node names the mover that wrote it: the others leave the rounds to it while its marks
	// keep coming (moverStale).
	Node string `json:"node,omitempty"`
}

// recordSubject is the subject of a copy written at written.
func (t *Tier) recordSubject(written time.Time) string {
	return t.rec + "." + strconv.FormatUint(uint64(unixHour(written)), 10)
}

// expectLast is the header of a publish conditional on the subject's last sequence.
func expectLast(m *nats.Msg, seq uint64) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(seq, 10))
}
