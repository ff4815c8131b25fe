package gateway

// RouteMsgs is the number of messages g's embedded server has sent its peers so far (tests
// count what crosses between servers per intent).
func RouteMsgs(g *Gateway) (int64, error) { return g.ns.RouteMsgs() }
