// Package kubeadapter makes vipd a kube-proxy replacement on one node: it
// watches Kubernetes Services and EndpointSlices with client-go shared
// informers and keeps vipd's services of owner "kubernetes" equal to what
// kube-proxy would program (the translation is internal/kubeconvert's), or,
// as the proxy named by WithServiceProxyName, exactly the Services labelled
// service.kubernetes.io/service-proxy-name with that name.
//
// It owns the informers, the change tracking (which Services are dirty, and
// since when), the one goroutine that talks to vipd, the adapter's
// Prometheus metrics and its /healthz. On start, whenever vipd is an
// instance (vipd's instance ID) it has not fully synced, and after every
// reconnect to the apiserver, it sends one SyncServices with the full
// state; after that one UpsertService or DeleteService per changed
// Service, with bursts coalesced; a create is create-only, so that a name
// another owner creates meanwhile is never taken over.
//
// It talks to vipd only through the public API (package client). It must
// never delete, overwrite or take over a service of another owner, never
// program the kernel itself, and never register metrics globally.
//
// The files follow the path of a change: adapter.go (the informers and
// their events), queue.go (the dirty set and the loop that takes it),
// fullsync.go and servicepass.go (the two kinds of pass), write.go (one
// service's write that survives another writer), leftout.go and claims.go
// (what vipd refused, and why), external.go (a Service whose node ports,
// external or load-balancer IPs vipd refuses keeps its cluster IPs),
// vipdhealth.go, healthz.go, metrics.go and serve.go.
package kubeadapter
