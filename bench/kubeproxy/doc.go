// Package kubeproxy renders and loads the iptables ruleset that kube-proxy
// (iptables mode, 1.28 and later, IPv4, ClusterIP services, Cluster traffic
// policy, no session affinity) would program for a set of services, with
// the external half of NodePort services (KUBE-NODEPORTS, KUBE-EXT-*,
// masquerade through KUBE-MARK-MASQ and KUBE-POSTROUTING; external traffic
// policy Cluster only). It is
// the peer that vipd's benchmarks measure against: what users run when they
// do not run vipd.
//
// Full renders a complete load and Partial the incremental restore of
// kube-proxy's partial sync after one service's endpoints changed; Restore
// pipes either into iptables-nft-restore inside a network namespace and
// times it. The package is test and benchmark scaffolding: it must never be
// pointed at the root network namespace, and vipd's own code must not
// import it.
package kubeproxy
