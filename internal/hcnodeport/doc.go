// Package hcnodeport serves the health-check node ports of services with
// an external traffic policy of Local, as kube-proxy does: for each such
// service with a HealthCheckNodePort, an HTTP server on that TCP port of
// every node-port address, inside the node's network namespace, that
// answers any request with the number of node-local backends that may
// take external traffic: 200 when there is one, 503 when there is none.
// A cloud load balancer uses it to send traffic only to nodes that would
// not drop it.
//
// It follows the state the dataplane was last given successfully
// (reconcile.WithAppliedHook), health-check results included, and that
// state's Node for the addresses. It programs nothing else: a port it
// cannot listen on is logged and reported as a warning, and tried again.
package hcnodeport
