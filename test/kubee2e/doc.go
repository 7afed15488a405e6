// Package kubee2e holds the end-to-end test of the Kubernetes route:
// Services and EndpointSlices from YAML manifests, served by client-go's
// fake clientset, drive the real vipd binary on each dataplane through
// the vipd-k8s adapter, and real connections from a lab pod and from a
// host outside the node (behind the lab's upstream router) check the
// result. It also checks that deploy/kubernetes is well formed and names
// only flags the binaries have. It has no code besides its tests.
package kubee2e
