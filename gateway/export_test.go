package gateway

import "github.com/oncegate/oncegate/internal/natsrv"

// RouteTraffic is what the routes of g's embedded server carried so far (tests count what
// crosses between servers per intent).
func RouteTraffic(g *Gateway) (natsrv.RouteTraffic, error) { return g.ns.RouteTraffic() }
