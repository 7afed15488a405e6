// Package kubeconvert turns Kubernetes Services and their EndpointSlices
// into vipd services, with kube-proxy's semantics: which Services are
// programmed at all, which endpoints serve which port, and in which state;
// and their external half (node ports, external IPs, load-balancer ingress
// IPs and source ranges, the external traffic policy and health-check node
// port), with what kube-proxy leaves out of it said as omissions.
//
// It owns the translation only. It must not watch the apiserver, talk to
// vipd, or read files: cmd/vipd-k8s (through internal/kubeadapter) and
// "vipctl apply -f" (through internal/manifest) both call it, so that a
// Service means the same in either route.
package kubeconvert
