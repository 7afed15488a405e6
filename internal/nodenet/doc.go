// Package nodenet follows the network of the node vipd programs (the
// namespace of vipd run --netns, or vipd's own) and describes it as a
// dataplane.Node: the node-port addresses and the interfaces, with those
// that external traffic arrives on marked External.
//
// A Watcher subscribes to netlink's link, address and route changes inside
// that namespace, and re-reads the whole picture after each burst of them
// (debounced) and on a period, as a safety net for a subscription that
// broke. It hands on a Node only when it differs from the previous one.
//
// It only reads: it never changes a link, an address or a route, and it
// programs nothing. What the Node means is dataplane's contract; the
// reconciler carries it to the dataplane (reconcile.SetNode).
package nodenet
