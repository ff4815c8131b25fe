package gateway

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/dashboard"
	"github.com/oncegate/oncegate/httpapi"
)

// newDashboard is the API's side of the dashboard: the hub that watches every process's
// snapshot for this node's open dashboards, and the tally of outcomes per tenant the API
// counts into. The hub runs until Stop.
func (g *Gateway) newDashboard(ctx context.Context, js jetstream.JetStream) httpapi.DashboardDeps {
	var tenants []string
	for _, t := range g.cfg.Tenants {
		tenants = append(tenants, t.ID)
	}
	hub := dashboard.NewHub(g.openDashboard(js), g.log.With().Str("component", "dashboard").Logger())
	g.dashTally = dashboard.NewTally(tenants)
	g.dashHub = startLoop(ctx, hub.Run)
	return httpapi.DashboardDeps{Hub: hub, Tally: g.dashTally, Public: g.cfg.Dashboard.Public}
}

// startDashboardPublisher posts this process's part of the cluster (its workers' executions,
// the copies following executions on its API, its counters) every dashboard.PostEvery, for
// every node's dashboard, until Stop.
func (g *Gateway) startDashboardPublisher(ctx context.Context, js jetstream.JetStream) {
	src := dashboard.Sources{Node: g.id, Roles: g.cfg.Role, Tally: g.dashTally, Metrics: g.metrics}
	if g.ns != nil {
		src.Server = g.ns.Name()
	}
	if g.pool != nil {
		pools := poolOf(g.pools)
		src.Executions, src.Backends, src.Events = pools.Running, g.pool.DashboardBackends, pools.Events
	}
	if g.intents != nil {
		src.Follows = g.intents.Following
	}
	pub := dashboard.NewPublisher(g.openDashboard(js), src, g.log.With().Str("component", "dashboard").Logger())
	g.dashPub = startLoop(ctx, pub.Run)
}

func (g *Gateway) openDashboard(js jetstream.JetStream) func(context.Context) (jetstream.KeyValue, error) {
	return func(ctx context.Context) (jetstream.KeyValue, error) { return dashboard.Open(ctx, js, g.res.replicas) }
}

// Running is the executions of every partition's pool, the oldest first, at most max, and
// how many run in all.
func (ps poolOf) Running(max int) (rows []dashboard.Execution, total int) {
	for _, p := range ps {
		if p == nil {
			continue
		}
		r, n := p.Running(max)
		rows, total = append(rows, r...), total+n
	}
	slices.SortFunc(rows, func(a, b dashboard.Execution) int {
		return cmp.Or(a.Started.Compare(b.Started), strings.Compare(a.JobID, b.JobID))
	})
	return rows[:min(max, len(rows))], total
}

// Events is the latest failures and takeovers of every partition's pool, newest first.
func (ps poolOf) Events(max int) []dashboard.Event {
	var out []dashboard.Event
	for _, p := range ps {
		if p == nil {
			continue
		}
		out = append(out, p.Events(max)...)
	}
	slices.SortFunc(out, func(a, b dashboard.Event) int { return b.At.Compare(a.At) })
	return out[:min(max, len(out))]
}
