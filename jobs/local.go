package jobs

import (
	"context"
	"sync/atomic"
)

// Local opens the feed of an execution that runs in this process for its one client (a
// bypassed request run where it was admitted, workers.Pool.RunLocal): the execution writes its
// chunks with the LocalPublisher, the follower reads them from memory, and nothing goes
// through CHUNKS. subject must be one no other execution uses (a bypass's key is made per
// execution). Close on the hub ends the feed as it ends the others (ErrHubClosed).
func (h *Hub) Local(subject string) (*Follower, *LocalPublisher, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, ErrHubClosed
	}
	f := &feed{hub: h, subject: subject, local: true, followers: make(map[*Follower]struct{})}
	fl := &Follower{f: f, wake: make(chan struct{}, 1)}
	f.followers[fl] = struct{}{}
	h.feeds[subject] = f
	return fl, &LocalPublisher{f: f}, nil
}

// LocalPublisher writes the chunks of a local feed (Hub.Local). Its chunks hold the payloads
// as they are given: the writer must not change a payload once published. Not safe for
// concurrent use (Next excepted), as Publisher.
type LocalPublisher struct {
	f    *feed
	next atomic.Int64
	meta Meta
}

// SetMeta sets what the first and the terminal chunk will say about the answer.
func (p *LocalPublisher) SetMeta(m Meta) { p.meta = m }

// Next is the index the next chunk will get (= chunks written so far).
func (p *LocalPublisher) Next() int { return int(p.next.Load()) }

// ExpiresAlone is true: nothing of a local feed is stored, so nothing needs a purge.
func (p *LocalPublisher) ExpiresAlone() bool { return true }

// Publish appends one chunk; its index is assigned here.
func (p *LocalPublisher) Publish(ctx context.Context, kind Kind, status int, payload []byte) error {
	return p.PublishRetry(ctx, kind, status, payload, 0)
}

// PublishRetry is Publish with a Retry-After (seconds) for a terminal error. A feed that
// ended (its follower left, or the hub closed) takes no more chunks and this is no error: the
// execution goes on to its end, as one whose followers all left does.
func (p *LocalPublisher) PublishRetry(_ context.Context, kind Kind, status int, payload []byte, retryAfter int) error {
	c := newChunk(p.Next(), kind, status, payload, p.meta, retryAfter)
	p.next.Add(1)
	p.f.mu.Lock()
	if p.f.done {
		p.f.mu.Unlock()
		return nil
	}
	p.f.appendUnlock(c)
	return nil
}
