// Package dashboard owns what the built-in dashboard shows and how every node's dashboard
// shows the whole cluster: each process (API and worker roles alike) posts a compact
// Snapshot of its own part — the executions it runs, the copies following executions on it,
// its request outcomes per tenant, its money counters, its backends and its recent failures
// and takeovers — to the DASHBOARD key-value bucket (memory storage, one key per process,
// expiring SnapshotTTL after the last post) about once a second; a Hub on each API node
// watches the bucket and, while at least one dashboard is open, aggregates the latest
// snapshot of every live process into a View (Aggregate) at most twice a second, filtered
// by the viewer's scope (all tenants, or one), and hands the encoded view to every open
// stream. The cost is bounded by construction: one watch per process whatever the number of
// open dashboards, one aggregation and one encoding per scope per tick, a snapshot capped at
// MaxExecutions, MaxFollows and MaxEvents rows (the view says when rows were left out).
//
// Why snapshots in NATS rather than asking the other nodes: every node already shares NATS,
// a watch costs nothing while nobody looks, a stopped process drops out on its own (TTL), and
// no node needs to know the others' addresses. The numbers are those of the running
// processes since they started: a process that stops takes its counters with it (the rates
// stay right; the totals drop). The durable figures stay the ledger's (the bill).
//
// History and rates: each Hub also samples the cluster's outcome and added-latency counters
// every HistoryEvery, open dashboard or not, into a fixed ring of HistoryLength (history.go
// states the bound), accounting each process's counters as increments so that a process that
// stops takes nothing out of it. A dashboard gets that history when it opens (Hub.History);
// every view carries the newest points and the rates over RateWindow (count delta over time
// delta between two samples). The history is the node's own record of the cluster since the
// node started.
//
// Followers: an execution's followers are the copies that joined it and still follow it,
// summed over every API node; the request that created the execution is not counted (five
// copies joined show five followers).
//
// Every type is safe for concurrent use; Publisher.Run and Hub.Run own their goroutines and
// return when their context ends.
package dashboard
