package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// UpdateEvery is the shortest time between two views sent to one dashboard (at most two
// updates a second).
const UpdateEvery = 500 * time.Millisecond

// Hub watches the snapshot bucket and feeds every open dashboard of this process. Views are
// built only while a dashboard is open, once per scope per tick, whatever the number of
// dashboards sharing the scope. Whether a dashboard is open or not, it samples the cluster's
// counters every HistoryEvery into its history (the last HistoryLength), which a dashboard
// gets first when it opens (History) and whose newest points and rates every view carries.
type Hub struct {
	open func(context.Context) (jetstream.KeyValue, error)
	log  zerolog.Logger
	now  func() time.Time
	hist *history

	mu     sync.Mutex
	latest map[string][]byte // the last snapshot of each process, raw
	subs   map[*Sub]struct{}
	closed bool
}

// Sub is one open dashboard's feed.
type Sub struct {
	scope Scope
	c     chan []byte
	hub   *Hub
	once  sync.Once
}

// C delivers the encoded views (JSON), at most one pending: a slow reader gets the latest. It
// is closed when the hub closes.
func (s *Sub) C() <-chan []byte { return s.c }

// Close ends the feed (idempotent).
func (s *Sub) Close() {
	s.once.Do(func() {
		h := s.hub
		h.mu.Lock()
		if _, ok := h.subs[s]; ok {
			delete(h.subs, s)
			close(s.c)
		}
		h.mu.Unlock()
	})
}

// NewHub reads the bucket open opens.
func NewHub(open func(context.Context) (jetstream.KeyValue, error), log zerolog.Logger) *Hub {
	return &Hub{open: open, log: log, now: time.Now, hist: newHistory(), latest: map[string][]byte{}, subs: map[*Sub]struct{}{}}
}

// History is scope's history as JSON (a History): what a dashboard shows first when it
// opens, before its first view.
func (h *Hub) History(scope Scope) ([]byte, error) {
	b, err := json.Marshal(h.hist.whole(scope))
	if err != nil {
		return nil, fmt.Errorf("dashboard: history: %w", err)
	}
	return b, nil
}

// Subscribe opens a feed for scope; ok is false once the hub is closed.
func (h *Hub) Subscribe(scope Scope) (*Sub, bool) {
	s := &Sub{scope: scope, c: make(chan []byte, 1), hub: h}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, false
	}
	h.subs[s] = struct{}{}
	return s, true
}

// Close ends every feed and refuses new ones, so the streams end before the HTTP server's
// shutdown waits for them.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.c)
	}
}

// Run watches the bucket and sends views until ctx ends.
func (h *Hub) Run(ctx context.Context) {
	var updates <-chan jetstream.KeyValueEntry
	var w jetstream.KeyWatcher
	defer func() {
		if w != nil {
			_ = w.Stop()
		}
	}()
	tick := time.NewTicker(UpdateEvery)
	defer tick.Stop()
	sample := time.NewTicker(HistoryEvery)
	defer sample.Stop()
	for {
		if w == nil {
			if kv, err := h.open(ctx); err == nil {
				if w, err = kv.WatchAll(ctx); err == nil {
					updates = w.Updates()
				}
			}
			if w == nil && ctx.Err() == nil {
				h.log.Debug().Msg("dashboard: the snapshot bucket is not watchable yet")
			}
		}
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			if !ok {
				_ = w.Stop()
				w, updates = nil, nil
				continue
			}
			if e == nil {
				continue // the initial values are in
			}
			h.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				h.latest[e.Key()] = bytes.Clone(e.Value())
			} else {
				delete(h.latest, e.Key())
			}
			h.mu.Unlock()
		case <-tick.C:
			h.send()
		case <-sample.C:
			h.sample()
		}
	}
}

// sample adds the latest snapshot of every live process to the history (a snapshot past
// send's staleness bound is a process that died: its counters no longer move).
func (h *Hub) sample() {
	now := h.now()
	h.mu.Lock()
	procs := make(map[string]procCounts, len(h.latest))
	for k, b := range h.latest {
		if p, err := decodeCounts(b); err == nil && now.Sub(p.At) <= 2*SnapshotTTL {
			procs[k] = p
		}
	}
	h.mu.Unlock()
	h.hist.sample(now, procs)
}

// send builds the view of every scope an open dashboard has and hands each its own.
func (h *Hub) send() {
	h.mu.Lock()
	if len(h.subs) == 0 {
		h.mu.Unlock()
		return
	}
	raw := make(map[string][]byte, len(h.latest))
	for k, b := range h.latest {
		raw[k] = b
	}
	scopes := map[Scope]bool{}
	for s := range h.subs {
		scopes[s.scope] = true
	}
	h.mu.Unlock()

	now := h.now()
	snaps := make([]Snapshot, 0, len(raw))
	var stale []string // a process that died without removing its snapshot (the TTL drops no watched key)
	for k, b := range raw {
		var s Snapshot
		if err := json.Unmarshal(b, &s); err != nil || now.Sub(s.At) > 2*SnapshotTTL {
			stale = append(stale, k)
			continue
		}
		snaps = append(snaps, s)
	}
	views := map[Scope][]byte{}
	for sc := range scopes {
		v := Aggregate(snaps, sc, now)
		v.Points, v.Rates = h.hist.recent(sc)
		b, err := json.Marshal(v)
		if err == nil {
			views[sc] = b
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range stale {
		if bytes.Equal(h.latest[k], raw[k]) {
			delete(h.latest, k)
		}
	}
	for s := range h.subs {
		b := views[s.scope]
		if b == nil {
			continue
		}
		select {
		case <-s.c: // a slow reader gets the latest view only
		default:
		}
		s.c <- b
	}
}
