// Package authz decides which owners' services a remote client may change.
//
// A Policy maps client identities to the owners whose services they may
// create, replace, delete or sync, or to every owner ("*"). It is read from
// the YAML file of vipd's --authz-file:
//
//	# identity: owners it may change, or "*"
//	spiffe://cluster.local/ns/kube-system/sa/vipd-controller: [kubernetes]
//	nomad-agent: [nomad, batch]
//	admin: "*"
//
// A client's identity is the first URI SAN of its certificate, or, when it
// has none, its subject's common name (Identity).
//
// The package only decides. The server attaches a Principal to the context
// of each call from a TCP client and asks it, inside the same transaction as
// the change, whether the owners involved may be changed; Unix-socket clients
// carry no Principal and are trusted. It owns no listener, no TLS and no
// gRPC status codes.
package authz
