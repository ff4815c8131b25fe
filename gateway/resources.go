package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/effects"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/replicas"
	"github.com/oncegate/oncegate/internal/status"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
	"github.com/oncegate/oncegate/workers"
)

// resources is the JetStream setup of a gateway: every stream and bucket, with its replicas,
// and the workers' consumer on JOBS. It runs at start, and again after any reconnect: a NATS
// server that restarted has lost its memory streams (JOBS, CHUNKS, the status
// bucket) and, with them, the consumer on JOBS. Safe for concurrent use (it holds no state
// besides its configuration).
type resources struct {
	js       jetstream.JetStream
	replicas int
	ttl      time.Duration // IDEM's record TTL
	hot      time.Duration // IDEM's hot TTL (0: no cold tier)
	// coldWanted: a hot TTL is set (idempotency.hot_ttl); cold: the store has a cold tier
	// (wanted, and not a store that kept its keys hot unless moveExisting), decided by the
	// first setup (coldDecided), which makes its OG_COLD streams.
	coldWanted, moveExisting, cold, coldDecided bool
	// coldBehind says why partition p's cold tier cannot tell a new key from a moved one yet
	// (cold.ErrBehind: its index has not applied the marks up to the hot tier's expiry), nil
	// when it can or there is none. Set once the tiers are open, before the readiness loop
	// starts; nil before that.
	coldBehind func(p partition.P) error
	lease      time.Duration // the JOBS consumer's AckWait
	// maxAckPending bounds the JOBS consumer's unacknowledged deliveries.
	maxAckPending int
	// parts is the partition count (nats.partitions, at least 1); place puts partition k's
	// streams on the servers tagged og-p<k> (nats.place_partitions).
	parts int
	place bool
	// self is the name of the NATS server in this process ("" without one): a partition's
	// streams it leads are reported (Partitions).
	self string
	// partMu guards partStates, what the last checks found of each partition, and when each
	// was checked (a partition on other servers is asked at most every remoteCheckEvery).
	partMu     sync.Mutex
	partStates []partition.State
	partAt     []time.Time
	// kick asks for the setup to run again (Gateway.kickSetup).
	kick func()
	// local reads a stream's Raft group from the NATS server in this process, missingStreams
	// which streams it lacks (both nil: no server in this process).
	local          replicas.Local
	missingStreams func([]string) []string
	// elsewhere caches which streams the server in this process holds no replica of were
	// found to exist by asking (confirmElsewhere), and when.
	elsewhereMu sync.Mutex
	elsewhere   map[string]bool
	elsewhereAt time.Time
	// state is what the setups found (setup, lost); until the first one, everything is missing.
	state setupState
}

// partitioned are the streams each partition has a copy of (a bucket's stream is
// KV_<bucket>); single are the tenant-wide ones, made once.
var (
	partitioned = []string{jobs.JobsStream, jobs.ChunksStream, kv.BucketStream, kv.ProgressStream, kv.RequestsStream, ledger.StreamName}
	single      = []string{ledger.TallyStreamName, status.Stream, kv.APIKeysStream, effects.BucketStream}
)

// streams are the streams ensure creates: every partition's copies and the single ones.
func (r *resources) streams() []string {
	var out []string
	for _, p := range partition.All(r.parts) {
		out = append(out, r.partitionStreams(p)...)
	}
	return append(out, single...)
}

// placement is where partition p's streams go: on its own servers (those tagged og-p<k>)
// when nats.place_partitions says so, else wherever JetStream puts them.
func (r *resources) placement(p partition.P) *jetstream.Placement {
	if !r.place {
		return nil
	}
	return &jetstream.Placement{Tags: []string{p.Tag()}}
}

// ErrPartitions is a start whose nats.partitions differs from the store's count.
var ErrPartitions = errors.New("the store has another partition count")

// checkPartitions refuses a start whose partition count is not the store's: a key hashes to
// another partition under another count, so its record would not be found (a re-executed
// intent). The store's count is read from which copies of IDEM exist: a copy of a partition
// beyond the count, or a count above one over an IDEM that holds records and lacks the last
// partition's copy. A store that has no records yet takes any count.
func (r *resources) checkPartitions(ctx context.Context) error {
	have, err := r.streamSet(ctx)
	if err != nil {
		return err
	}
	for k := r.parts; k < partition.Max; k++ {
		if have[partition.P(k).Stream(kv.BucketStream)] {
			return fmt.Errorf("%w: %s exists, so it has at least %d partitions; nats.partitions is %d (a different count would re-hash every key: no migration exists yet)",
				ErrPartitions, partition.P(k).Stream(kv.BucketStream), k+1, r.parts)
		}
	}
	last := partition.P(r.parts - 1).Stream(kv.BucketStream)
	if r.parts > 1 && have[kv.BucketStream] && !have[last] {
		st, err := r.js.Stream(ctx, kv.BucketStream)
		if err != nil {
			return fmt.Errorf("reading %s: %w", kv.BucketStream, err)
		}
		if st.CachedInfo().State.Msgs > 0 {
			return fmt.Errorf("%w: %s holds records and %s does not exist, so it has fewer partitions; nats.partitions is %d (a different count would re-hash every key: no migration exists yet)",
				ErrPartitions, kv.BucketStream, last, r.parts)
		}
	}
	return nil
}

// ensure creates or updates every stream, bucket and the JOBS consumers; idempotent, and it
// never lowers a replica count.
func (r *resources) ensure(ctx context.Context) error {
	if r.coldWanted && !r.coldDecided {
		kept, err := keptHot(ctx, r.js, r.ttl)
		if err != nil {
			return err
		}
		r.cold, r.coldDecided = r.moveExisting || !kept, true
	}
	for _, p := range partition.All(r.parts) {
		if err := jobs.EnsureStreams(ctx, r.js, jobs.StreamConfig{Replicas: r.replicas, Partition: p, Placement: r.placement(p),
			MaxChunkBytes: jobs.DefaultMaxChunkBytes / int64(r.parts)}); err != nil {
			return err
		}
		if _, err := kv.Open(ctx, r.js, kv.BucketConfig{TTL: r.ttl, HotTTL: r.hot, Replicas: r.replicas, Partition: p, Placement: r.placement(p)}); err != nil {
			return err
		}
		if r.cold {
			if _, err := cold.EnsureStream(ctx, r.js, cold.Config{TTL: r.ttl, Replicas: r.replicas, Partition: p, Placement: r.placement(p)}); err != nil {
				return err
			}
		}
		if _, err := workers.EnsureConsumer(ctx, r.js, p, r.lease, r.maxAckPending); err != nil {
			return err
		}
		if err := ledger.EnsurePartition(ctx, r.js, p, r.replicas, r.placement(p)); err != nil {
			return err
		}
	}
	if err := ledger.EnsureTally(ctx, r.js, r.replicas); err != nil {
		return err
	}
	if _, err := status.Open(ctx, r.js, statusTTL, r.replicas); err != nil {
		return err
	}
	if _, err := kv.OpenAPIKeys(ctx, r.js, r.replicas); err != nil {
		return err
	}
	if _, err := effects.Open(ctx, r.js, effects.Config{TTL: r.ttl, Replicas: r.replicas}); err != nil {
		return err
	}
	return nil
}

// admitStreams are the streams an admission in partition p writes, the record (IDEM) and the
// job (JOBS), each with a subject no message is ever stored on: a read of it is answered (not
// found) only by a server that holds the stream.
func admitStreams(p partition.P) []struct{ name, probe string } {
	return []struct{ name, probe string }{
		{p.Stream(kv.BucketStream), "$KV." + p.Stream(kv.Bucket) + ".readyz-probe"},
		{jobs.JobsStreamOf(p), p.Subject("jobs.run.readyz-probe")},
	}
}

// leaderAnswers asks stream's leader (a message get, which only the leader answers, unlike a
// direct get any replica answers) for the last message on probe: "no message" or a message
// both say a leader serves the stream.
func (r *resources) leaderAnswers(ctx context.Context, stream, probe string) error {
	_, err := jsleader.Get(ctx, r.js.Conn(), jetstream.DefaultAPIPrefix, stream, jsleader.Request{LastBySubject: probe})
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case errors.As(err, &apiErr):
		return fmt.Errorf("stream %s: leader answers %q", stream, apiErr.Description)
	}
	return fmt.Errorf("stream %s: no leader answers: %w", stream, err)
}

// Check is /readyz's question, asked by the API's readiness loop (never by a request): nil
// when this node can admit a request, else an error that says why not. It can when the last
// setup found every stream, bucket and the workers' consumer on JOBS and nothing has said
// since that one is gone (a reconnect, a deletion advisory: watchDeletes), and IDEM's and
// JOBS's streams each have a leader that has heard from a quorum of its replicas
// (replicas.Quorate: a leader that can commit the record's create and the job's publish).
// While something is missing it asks for the setup to run again.
//
// It asks JetStream nothing when the NATS server in this process holds a replica of both
// streams (an embedded node: their Raft groups say it, see natsrv.StreamView), so an idle
// node is quiet (issue 44); otherwise it asks each stream's leader (stream info, and a
// message get only the leader answers). ctx bounds the whole check.
func (r *resources) Check(ctx context.Context) error {
	if missing := r.missingNow(); missing != "" {
		r.kick()
		return errors.New(missing)
	}
	// nats-server's deletion advisory of a stream is not always sent (the stream's send loop
	// may quit before it), so the streams' presence is also read: from this process's server
	// when there is one, else by asking (on an external NATS every check asks, as before).
	var missing []string
	if r.missingStreams != nil {
		if missing = r.missingStreams(r.streams()); len(missing) > 0 {
			var err error
			if missing, err = r.confirmElsewhere(ctx, missing); err != nil {
				return err
			}
		}
	} else if err := r.askMissing(ctx, &missing); err != nil {
		return err
	}
	if len(missing) > 0 {
		why := fmt.Sprintf("JetStream is missing %s (lost with a NATS restart?); recreating", strings.Join(missing, ", "))
		r.lost(why)
		return errors.New(why)
	}
	if r.parts == 1 {
		return r.admits(ctx, 0) // nothing to list per partition (Partitions stays empty)
	}
	// With partitions, the node is ready while one partition admits: a request of a partition
	// that cannot is answered 503 store_unavailable with Retry-After by its own admission,
	// and the others' keys are served (a partition's servers down stop that partition only).
	// A partition this node's server holds no replica of is asked about (four JetStream
	// requests) at most every remoteCheckEvery, so an idle node stays quiet.
	var first error
	ready := false
	for _, p := range partition.All(r.parts) {
		st, fresh := r.partition(p)
		if !fresh || r.isLocal(p) {
			now := time.Now()
			err := r.admits(ctx, p)
			st = r.record(p, err, now)
		}
		switch {
		case st.Admits:
			ready = true
		case first == nil:
			first = fmt.Errorf("partition %d: %s", p, st.Reason)
		}
	}
	if ready {
		return nil
	}
	return first
}

// remoteCheckEvery is how often Check asks about a partition whose streams this node's server
// holds no replica of.
const remoteCheckEvery = 10 * time.Second

// isLocal says whether this node's server holds a replica of p's records.
func (r *resources) isLocal(p partition.P) bool {
	if r.local == nil {
		return false
	}
	_, ok := r.local(p.Stream(kv.BucketStream))
	return ok
}

// partition is what the last check found of p, and whether it is recent enough to stand.
func (r *resources) partition(p partition.P) (partition.State, bool) {
	r.partMu.Lock()
	defer r.partMu.Unlock()
	if int(p) >= len(r.partStates) {
		return partition.State{Partition: p}, false
	}
	return r.partStates[p], time.Since(r.partAt[p]) < remoteCheckEvery
}

// record keeps what a check of p found (err nil: it admits) and which of its streams this
// node's server leads.
func (r *resources) record(p partition.P, err error, at time.Time) partition.State {
	st := partition.State{Partition: p, Admits: err == nil}
	if err != nil {
		st.Reason = err.Error()
	}
	if r.local != nil && r.self != "" {
		for _, name := range r.partitionStreams(p) {
			if v, ok := r.local(name); ok && v.Leader == r.self {
				st.Leads = append(st.Leads, name)
			}
		}
	}
	r.partMu.Lock()
	defer r.partMu.Unlock()
	for len(r.partStates) < r.parts {
		r.partStates = append(r.partStates, partition.State{Partition: partition.P(len(r.partStates))})
		r.partAt = append(r.partAt, time.Time{})
	}
	r.partStates[p], r.partAt[p] = st, at
	return st
}

// partitionStreams are p's copies of the partitioned streams.
func (r *resources) partitionStreams(p partition.P) []string {
	out := make([]string, len(partitioned))
	for i, s := range partitioned {
		out[i] = p.Stream(s)
	}
	return out
}

// Partitions is what the last checks found of every partition (/readyz's detail, the
// partition metrics); empty before the first check, and always with one partition.
func (r *resources) Partitions() []partition.State {
	r.partMu.Lock()
	defer r.partMu.Unlock()
	return slices.Clone(r.partStates)
}

// admits is Check's question about partition p: its IDEM and JOBS each have a leader with a
// quorum, and its cold tier, if it has one, can tell a new key from a moved one (while it
// cannot, every new key of the partition is answered 503 store_unavailable: /readyz says so
// too, rather than 200 while this node refuses every new intent).
func (r *resources) admits(ctx context.Context, p partition.P) error {
	if r.coldBehind != nil {
		if err := r.coldBehind(p); err != nil {
			return err
		}
	}
	for _, a := range admitStreams(p) {
		if r.local != nil {
			if v, ok := r.local(a.name); ok {
				switch {
				case v.Leader == "":
					return fmt.Errorf("stream %s has no leader this node hears from", a.name)
				case !v.Quorate:
					return fmt.Errorf("stream %s has no leader with a quorum of its replicas (leader %q)", a.name, v.Leader)
				}
				continue
			}
		}
		if err := r.askLeader(ctx, a.name, a.probe); err != nil {
			return err
		}
	}
	return nil
}

// askMissing lists the streams and asks for the workers' consumer on JOBS, adding what is
// missing to missing.
func (r *resources) askMissing(ctx context.Context, missing *[]string) error {
	have, err := r.streamSet(ctx)
	if err != nil {
		return err
	}
	for _, n := range r.streams() {
		if !have[n] {
			*missing = append(*missing, n)
		}
	}
	if len(*missing) > 0 {
		return nil
	}
	for _, p := range partition.All(r.parts) {
		jobsStream := jobs.JobsStreamOf(p)
		if _, err := r.js.Consumer(ctx, jobsStream, workers.ConsumerName); errors.Is(err, jetstream.ErrConsumerNotFound) {
			*missing = append(*missing, "consumer "+jobsStream+"/"+workers.ConsumerName)
		} else if err != nil {
			return fmt.Errorf("consumer %s/%s does not answer: %w", jobsStream, workers.ConsumerName, err)
		}
	}
	return nil
}

// confirmElsewhere is which of the streams the server in this process does not hold are
// really missing. On a cluster larger than a stream's replicas (partitions placed on their own
// servers, or five nodes with R3) a server knows only the streams it holds a replica of: the
// others are asked about, in one request, at most every remoteCheckEvery (deletions in between
// are seen by watchDeletes).
func (r *resources) confirmElsewhere(ctx context.Context, candidates []string) ([]string, error) {
	r.elsewhereMu.Lock()
	defer r.elsewhereMu.Unlock()
	if r.elsewhere == nil || time.Since(r.elsewhereAt) >= remoteCheckEvery {
		have, err := r.streamSet(ctx)
		switch {
		case err == nil:
			r.elsewhere, r.elsewhereAt = have, time.Now()
		case r.elsewhere == nil:
			return nil, err
		}
		// A listing that failed keeps what the last one found: it needs the meta leader, lost
		// with half of a partitioned cluster's servers, and the streams it found still exist
		// (nothing is deleted without that leader); whether each partition admits is asked of
		// its own leaders next. Failing here said "not ready" on every node within
		// remoteCheckEvery although the surviving partition admitted.
	}
	var missing []string
	for _, n := range candidates {
		if !r.elsewhere[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		r.elsewhere = nil // asked again at the next check, after the setup recreates them
	}
	return missing, nil
}

// streamSet lists the account's streams (one JetStream request).
func (r *resources) streamSet(ctx context.Context) (map[string]bool, error) {
	have := map[string]bool{}
	names := r.js.StreamNames(ctx)
	for n := range names.Name() {
		have[n] = true
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("listing JetStream streams: %w", err)
	}
	return have, nil
}

// askLeader is Check's question about one stream when no server in this process can answer
// it: the stream's info, then its leader.
func (r *resources) askLeader(ctx context.Context, stream, probe string) error {
	st, err := r.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		why := "JetStream is missing stream " + stream + " (lost with a NATS restart?); recreating"
		r.lost(why)
		return errors.New(why)
	}
	if err != nil {
		return fmt.Errorf("stream %s does not answer: %w", stream, err)
	}
	if cl := st.CachedInfo().Cluster; !replicas.Quorate(cl) {
		return fmt.Errorf("stream %s has no leader with a quorum of its replicas (leader %q)", stream, cl.Leader)
	}
	// A stream's info can be stale (the meta leader's assignment still names a one-replica
	// stream's stopped server; a follower's view still names a leader that just stopped:
	// CI saw /readyz ready in both outages), so the stream's leader is asked too.
	return r.leaderAnswers(ctx, stream, probe)
}

// setupState is what the last setup found, and whether anything has been lost since.
type setupState struct {
	mu sync.Mutex
	// epoch counts the losses (lost); a setup clears missing only when none came while it ran.
	epoch uint64
	// missing says what is missing and why ("" when the last setup found everything).
	missing string
	// repaired says a setup has run since the loss: missing is reported once more (a loss
	// repaired within a check period is still seen) and then cleared.
	repaired bool
}

// missingNow is what Check reports while something is missing ("" when nothing is).
func (r *resources) missingNow() string {
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	m := r.state.missing
	if r.state.repaired {
		r.state.missing, r.state.repaired = "", false
	}
	return m
}

// lost records that something may be gone (a stream, the consumer, or anything after a
// reconnect), so /readyz says why until a setup succeeds, and asks for that setup.
func (r *resources) lost(why string) {
	r.state.mu.Lock()
	r.state.epoch++
	r.state.missing, r.state.repaired = why, false
	r.state.mu.Unlock()
	r.kick()
}

// setup is ensure, and on success the end of what lost recorded before it began.
func (r *resources) setup(ctx context.Context) error {
	r.state.mu.Lock()
	epoch := r.state.epoch
	r.state.mu.Unlock()
	if err := r.ensure(ctx); err != nil {
		return err
	}
	r.state.mu.Lock()
	defer r.state.mu.Unlock()
	if r.state.epoch == epoch && r.state.missing != "" {
		r.state.repaired = true
	}
	return nil
}

// Deletion advisories of the streams and of the workers' consumer (nats-server publishes them
// when a stream or consumer is deleted, by a request or by its limits).
const (
	streamDeleted   = "$JS.EVENT.ADVISORY.STREAM.DELETED."
	consumerDeleted = "$JS.EVENT.ADVISORY.CONSUMER.DELETED."
)

// watchDeletes listens on nc for the deletion of any stream or of the workers' consumer and
// records it (lost), so a deletion under a connected gateway (no reconnect to notice it) is
// seen without asking JetStream what exists every second. The subscription lives as long as
// nc (nats.go renews it after a reconnect).
func (r *resources) watchDeletes(nc *nats.Conn) error {
	ours := map[string]string{}
	subjects := []string{streamDeleted + "*"}
	for _, p := range partition.All(r.parts) {
		js := jobs.JobsStreamOf(p)
		ours[consumerDeleted+js+"."+workers.ConsumerName] = "consumer " + js + "/" + workers.ConsumerName
		subjects = append(subjects, consumerDeleted+js+".*")
	}
	for _, n := range r.streams() {
		ours[streamDeleted+n] = "stream " + n
	}
	for _, subj := range subjects {
		if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
			if what, ok := ours[m.Subject]; ok {
				r.lost("JetStream is missing " + what + " (deleted); recreating")
			}
		}); err != nil {
			return fmt.Errorf("subscribing to JetStream's deletion advisories: %w", err)
		}
	}
	return nc.Flush()
}

// Setup attempts after a reconnect: a restarted server (or a cluster electing leaders) may take
// a while to answer, so the setup is retried with a growing wait, then left to the next kick.
const (
	resAttempts    = 30
	resAttemptTime = 5 * time.Second
	resFirstWait   = 50 * time.Millisecond
	resMaxWait     = 2 * time.Second
)

// kickSetup asks resLoop to run the setup again; kicks while one is pending coalesce.
func (g *Gateway) kickSetup() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// startResLoop runs the setup again on every kick until Stop.
func (g *Gateway) startResLoop(ctx context.Context) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.stopRes, g.resDone = cancel, make(chan struct{})
	go func() {
		defer close(g.resDone)
		for {
			select {
			case <-rctx.Done():
				return
			case <-g.kick:
			}
			g.resetup(rctx)
		}
	}()
}

// resetup runs the setup until it succeeds, resAttempts fail, or ctx ends.
func (g *Gateway) resetup(ctx context.Context) {
	wait := resFirstWait
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, resAttemptTime)
		err := g.res.setup(actx)
		if hubs := g.resyncHubs.Load(); err == nil && hubs != nil {
			for _, hub := range *hubs {
				if err = hub.Resync(actx); err != nil {
					break
				}
			}
		}
		cancel()
		if err == nil {
			g.log.Debug().Int("attempt", attempt).Msg("JetStream streams and buckets checked after a reconnect")
			return
		}
		if ctx.Err() != nil {
			return
		}
		if attempt == resAttempts {
			g.log.Error().Err(err).Int("attempt", attempt).Msg("JetStream streams and buckets could not be recreated; retrying on the next reconnect or /readyz check")
			return
		}
		g.log.Warn().Err(err).Int("attempt", attempt).Msg("recreating JetStream streams and buckets")
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, resMaxWait)
	}
}

// natsShape is what chooseReplicas sizes the replicas from.
type natsShape struct {
	// routes is the embedded server's configured cluster routes (every node lists every node,
	// itself included, and Validate refuses duplicates); 0 when it is not a cluster node.
	routes int
	// cluster is the name of the cluster the client is connected to ("" for a single server).
	cluster string
	// servers is the servers the client knows: its URLs and the ones the cluster advertised.
	servers int
}

// shapeOf is the shape of the NATS a gateway uses: the embedded server (ns is set) with the
// cluster cl, or the external NATS nc is connected to.
func shapeOf(cl config.NATSCluster, nc *nats.Conn, embedded bool) natsShape {
	if embedded {
		// The cluster is the configured one: at start, an in-process client knows only the
		// servers the cluster advertised so far, often fewer than the routes name.
		if cl.Enabled() {
			return natsShape{routes: len(cl.Routes), cluster: cl.Name}
		}
		return natsShape{}
	}
	return natsShape{cluster: nc.ConnectedClusterName(), servers: len(nc.Servers())}
}

// chooseReplicas is nats.replicas (set), or when it is 0: 3 on an embedded cluster node whose
// routes name 3 or more nodes, or on an external cluster of 3 or more servers the client
// knows; 1 otherwise.
func chooseReplicas(set int, s natsShape) int {
	if set > 0 {
		return set
	}
	n := s.servers
	switch {
	case s.routes > 0:
		n = s.routes
	case s.cluster == "":
		return 1
	}
	if n >= 3 {
		return 3
	}
	return 1
}
