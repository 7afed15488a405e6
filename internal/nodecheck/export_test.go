package nodecheck

// RouteGets is how many kernel route lookups c's checks made so far.
func (c *Checker) RouteGets() int { return c.routeGets }

// SetMaxRouteGets sets maxRouteGets until the returned func restores it.
func SetMaxRouteGets(n int) (restore func()) {
	old := maxRouteGets
	maxRouteGets = n
	return func() { maxRouteGets = old }
}
