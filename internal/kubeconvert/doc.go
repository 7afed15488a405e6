// Package kubeconvert turns Kubernetes Services and their EndpointSlices
// into vipd services, with kube-proxy's ClusterIP semantics: which Services
// are programmed at all, which endpoints serve which port, and in which
// state.
//
// It owns the translation only. It must not watch the apiserver, talk to
// vipd, or read files: cmd/vipd-k8s (through internal/kubeadapter) and
// "vipctl apply -f" (through internal/manifest) both call it, so that a
// Service means the same in either route.
package kubeconvert
