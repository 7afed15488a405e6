// Package validation checks API objects, fills in their defaults, and turns
// them into dataplane values, and flow requests into the flow hub's filters.
// It returns field violations named by their path in the request (such as
// "service.ports[1].port", a syntax ResolvePath checks against the request);
// turning those into gRPC errors is the server's job, not this package's.
// It checks the per-service limits of Limits; the totals are the store's.
package validation
