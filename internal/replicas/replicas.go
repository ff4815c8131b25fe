// Package replicas decides how many replicas a JetStream stream (or a key-value bucket's
// stream) is created or updated with at start-up: the configured count, or the existing
// stream's when that is larger, so a start never lowers replicas an operator raised. It also
// turns NATS's refusal of a replica count into one line that says what to do, and reads a
// stream's cluster state (Scaled, Quorate).
//
// A leaf: kv, jobs, ledger and the status board call it for their own streams. Stateless.
package replicas

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrReplicas is returned (as a [*Error]) when NATS refuses a stream's replica count: a single
// server asked for more than one, a cluster with too few servers (or too little room), or an
// existing stream that cannot be raised in place.
var ErrReplicas = errors.New("replicas: NATS cannot hold the stream with this many replicas")

// Error is a refused replica count, with the one line an operator needs.
type Error struct {
	Stream string
	// Have is the existing stream's replica count (0: it did not exist), Want the count asked.
	Have, Want int
	// Cause is NATS's own description (text only: NATS errors do not leave the stores).
	Cause string
	// single: NATS said it is not clustered.
	single bool
}

func (e *Error) Error() string {
	switch {
	case e.single:
		return fmt.Sprintf("stream %s: nats.replicas is %d but NATS is a single server, not a cluster: set nats.replicas to 1, or run NATS as a cluster of at least %d servers",
			e.Stream, e.Want, e.Want)
	case e.Have > 0 && e.Have < e.Want:
		return fmt.Sprintf("stream %s: cannot raise it from %d to %d replicas (NATS: %s): raise it by hand (nats stream edit %s --replicas %d) or set nats.replicas to %d",
			e.Stream, e.Have, e.Want, e.Cause, e.Stream, e.Want, e.Have)
	}
	return fmt.Sprintf("stream %s: NATS cannot place %d replicas (NATS: %s): set nats.replicas to at most the number of JetStream servers in the cluster, or add servers",
		e.Stream, e.Want, e.Cause)
}

// PeersMissing reports whether err is a cluster refusing a count for want of peers (too few
// servers up, or too little room), not a single server: on a cluster that is still forming,
// a node whose peers have not all joined yet gets it, and it passes once they have.
func PeersMissing(err error) bool {
	var e *Error
	return errors.As(err, &e) && !e.single
}

// Is makes errors.Is(err, ErrReplicas) true.
func (e *Error) Is(target error) bool { return target == ErrReplicas }

// NATS error codes that refuse a replica count: not clustered, no suitable peers for placement,
// insufficient resources.
const (
	codeNotClustered    jetstream.ErrorCode = 10074
	codeNoSuitablePeers jetstream.ErrorCode = 10005
	codeInsufficient    jetstream.ErrorCode = 10023
)

// Of is the replica count to give stream: want, or the existing stream's count when larger.
// have is the existing count (0 when the stream does not exist).
func Of(ctx context.Context, js jetstream.JetStream, stream string, want int) (n, have int, err error) {
	want = max(want, 1)
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return want, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("replicas: stream %s: %w", stream, err) // %w: a timeout is retried by the caller
	}
	have = st.CachedInfo().Config.Replicas
	return max(want, have), have, nil
}

// Explain returns err as an [*Error] when it is NATS refusing n replicas of stream (have: the
// existing count, 0 for a new stream), and err unchanged otherwise.
func Explain(stream string, have, n int, err error) error {
	var apiErr *jetstream.APIError
	if n <= 1 || !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case codeNotClustered, codeNoSuitablePeers, codeInsufficient:
		return &Error{Stream: stream, Have: have, Want: n, Cause: apiErr.Description, single: apiErr.ErrorCode == codeNotClustered}
	}
	return err
}

// Ensure creates stream cfg, or updates the existing one to cfg, with cfg.Replicas or the
// existing stream's replica count when that is larger. A refused count is an [*Error].
func Ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	n, have, err := Of(ctx, js, cfg.Name, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	cfg.Replicas = n
	st, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, Explain(cfg.Name, have, n, err)
	}
	if err := WaitRaised(ctx, js, cfg.Name, have, n); err != nil {
		return nil, err
	}
	return st, nil
}

// scalePoll is how often WaitRaised reads a stream's state.
const scalePoll = 100 * time.Millisecond

// WaitRaised waits, when the stream was just raised from have to n replicas, until every
// replica is in place and current. Writes can stall while it scales (JOBS, with the workers'
// consumer, took ~12 s on a 3-node test cluster and a submit timed out meanwhile): a start
// that raised a stream serves only once it is done.
func WaitRaised(ctx context.Context, js jetstream.JetStream, stream string, have, n int) error {
	if have == 0 || have >= n {
		return nil
	}
	t := time.NewTicker(scalePoll)
	defer t.Stop()
	var last *jetstream.ClusterInfo // as last read: what the error says when the wait gives up
	for {
		st, err := js.Stream(ctx, stream)
		if err == nil {
			last = st.CachedInfo().Cluster
			if Scaled(last, n) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return &Error{Stream: stream, Have: have, Want: n, Cause: "still scaling when the start gave up: " + ctx.Err().Error() + "; " + describe(last)}
		case <-t.C:
		}
	}
}

// describe is a stream's cluster state as a scale-up waits on it: its leader, each replica
// (current or not, its lag, when the leader last heard from it) and the peers a
// reconfiguration in flight moves it to.
func describe(ci *jetstream.ClusterInfo) string {
	if ci == nil {
		return "its cluster state was never read"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "last seen: leader %q", ci.Leader)
	for _, p := range ci.Replicas {
		state := "current"
		if !p.Current {
			state = "not current"
		}
		fmt.Fprintf(&b, ", replica %s %s (lag %d, heard %s ago)", p.Name, state, p.Lag, p.Active.Round(time.Millisecond))
	}
	if d := ci.Desired; d != nil {
		names := make([]string, 0, len(d.Replicas))
		for _, p := range d.Replicas {
			names = append(names, p.Name)
		}
		fmt.Fprintf(&b, ", moving to [%s] since %s", strings.Join(names, " "), d.Created.UTC().Format(time.RFC3339))
		if st := d.Status; st != nil {
			fmt.Fprintf(&b, ": %s", st.Description)
			if st.Err != "" {
				fmt.Fprintf(&b, " (%s)", st.Err)
			}
		}
	}
	return b.String()
}

// Scaled reports whether a stream's cluster state shows n replicas, all current, and no
// reconfiguration in flight.
func Scaled(ci *jetstream.ClusterInfo, n int) bool {
	if ci == nil || ci.Desired != nil || len(ci.Replicas) != n-1 {
		return false
	}
	for _, p := range ci.Replicas {
		if !p.Current {
			return false
		}
	}
	return true
}

// Heard is how recently a stream's leader must have heard from a replica for it to count
// towards a quorum: raft heartbeats go out every second, so a live replica is heard within
// about one; the server itself waits 10 s before it calls a silent replica not current.
const Heard = 1500 * time.Millisecond

// Quorate reports whether a stream's cluster info shows a leader that has heard from a quorum
// of its group (itself included) within Heard: a leader that can commit a write. No cluster
// info is one server.
func Quorate(cl *jetstream.ClusterInfo) bool {
	if cl == nil || len(cl.Replicas) == 0 {
		return cl == nil || cl.Leader != ""
	}
	if cl.Leader == "" {
		return false
	}
	heard := 1 // the leader
	for _, r := range cl.Replicas {
		if !r.Offline && r.Active <= Heard {
			heard++
		}
	}
	return heard > (len(cl.Replicas)+1)/2
}

// EnsureKV creates or updates key-value bucket cfg as Ensure does a stream: with cfg.Replicas
// or the bucket's existing count when that is larger.
func EnsureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	stream := "KV_" + cfg.Bucket
	n, have, err := Of(ctx, js, stream, cfg.Replicas)
	if err != nil {
		return nil, err
	}
	cfg.Replicas = n
	kvs, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, Explain(stream, have, n, err)
	}
	if err := WaitRaised(ctx, js, stream, have, n); err != nil {
		return nil, err
	}
	return kvs, nil
}

// RecordsKV is the configuration of a bucket of records that must survive a crash (the
// idempotency records, the effects ledger): file storage, one value per key, kept ttl after
// its last write, on n replicas (for EnsureKV).
func RecordsKV(bucket string, ttl time.Duration, n int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: bucket, History: 1, TTL: ttl, Storage: jetstream.FileStorage, Replicas: n}
}
