// Package validation turns API objects into dataplane values, and flow
// requests into the flow hub's filters. It has two halves:
//
//   - The conversion (convert.go: ConvertService, ConvertBackend) is
//     structural and total: it fills in defaults, writes addresses in
//     canonical form, and fails only where a value has no dataplane form
//     (an address that does not parse, a port out of range, an unknown
//     enum, a duplicated key). The store loads the state file and the
//     journal through it alone, so a state that an earlier vipd wrote
//     always loads, whatever rules new writes follow now.
//   - The admission policy (validation.go: Service, ServiceInPlace,
//     Backend, Name) is what the API applies to new writes before it
//     converts them: lengths, counts, character sets, address classes,
//     --service-cidr and the per-service limits of Limits (the totals are
//     the store's). It may tighten between versions; the conversion may
//     not.
//
// Both return field violations named by their path in the request (such as
// "service.ports[1].port", a syntax ResolvePath checks against the
// request); turning those into gRPC errors is the server's job, not this
// package's.
package validation
