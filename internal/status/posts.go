package status

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// subjects are the bucket's keys on the wire: a post (a KV put) and a removal (a KV delete)
// are messages on $KV.STATUS.<worker>, which any core subscriber receives as the stream does.
const subjects = "$KV." + Bucket + "."

// Posts counts the workers whose posts to the board this process has seen lately, from a core
// subscription to the board's subjects: no consumer, no JetStream request. It is how an API
// node knows, at no cost while idle (issue 44), that some worker consumes the JOBS queue: a
// worker posts every two seconds while its pool runs and removes its entry when it stops; one
// that died without removing it stops counting ttl after its last post, as its entry expires.
// It knows nothing of posts made before it subscribed (read the board then). Safe for
// concurrent use.
type Posts struct {
	ttl time.Duration
	now func() time.Time

	mu   sync.Mutex
	last map[string]time.Time // worker → when its last post was seen
}

// WatchPosts subscribes on nc to the board's posts; a worker counts until ttl after its last
// one (the bucket's TTL). The subscription lives as long as nc (nats.go renews it after a
// reconnect).
func WatchPosts(nc *nats.Conn, ttl time.Duration) (*Posts, error) {
	p := &Posts{ttl: ttl, now: time.Now, last: map[string]time.Time{}}
	if _, err := nc.Subscribe(subjects+">", p.saw); err != nil {
		return nil, fmt.Errorf("status: watch posts: %w", err)
	}
	if err := nc.Flush(); err != nil {
		return nil, fmt.Errorf("status: watch posts: %w", err)
	}
	return p, nil
}

func (p *Posts) saw(m *nats.Msg) {
	worker := strings.TrimPrefix(m.Subject, subjects)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch m.Header.Get(jsKVOperation) {
	case "DEL", "PURGE":
		delete(p.last, worker)
	default:
		p.last[worker] = p.now()
	}
}

// jsKVOperation is the header a KV delete or purge carries (nats.go's kvop).
const jsKVOperation = "KV-Operation"

// Workers is how many workers posted within ttl and have not removed their entry since.
func (p *Posts) Workers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for w, at := range p.last {
		if now.Sub(at) > p.ttl {
			delete(p.last, w)
		}
	}
	return len(p.last)
}

// Posting reports whether worker posted within ttl and has not removed its entry since: its
// pool runs (as far as this process has seen since it subscribed).
func (p *Posts) Posting(worker string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.last[worker]
	return ok && p.now().Sub(at) <= p.ttl
}
