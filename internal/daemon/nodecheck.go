package daemon

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/nodecheck"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// nodeNeeds is what the dataplane named dp relies on in the node besides
// IP forwarding; ok is false for a dataplane that programs nothing.
func nodeNeeds(dp string) (needs nodecheck.Needs, ok bool) {
	switch dp {
	case iptables.Name:
		// Its REJECT for services without backends comes after routing,
		// and its flow source reads netfilter conntrack.
		return nodecheck.Needs{VIPRoutes: true, Conntrack: true}, true
	case ebpf.Name:
		// It translates before routing, rejects in its programs, and
		// tracks connections in its own maps.
		return nodecheck.Needs{}, true
	}
	return nodecheck.Needs{}, false
}

// newNodeCheck returns the checker of the node prerequisites of the
// dataplane named dp, in cfg.NetNS, or nil for a dataplane that programs
// nothing. It checks nothing yet: see runNodeCheck.
func newNodeCheck(log hclog.Logger, cfg Config, dp string) *nodecheck.Checker {
	needs, ok := nodeNeeds(dp)
	if !ok {
		return nil
	}
	return nodecheck.New(log, nodecheck.Config{NetNS: cfg.NetNS, Needs: needs, SetSysctls: cfg.SetSysctls})
}

// runNodeCheck checks c once, then every period until the returned stop is
// called, against the VIPs of the current snapshot. A nil c checks
// nothing.
func runNodeCheck(ctx context.Context, c *nodecheck.Checker, period time.Duration, snapshot func() *store.Snapshot) (stop func()) {
	if c == nil {
		return func() {}
	}
	vips := snapshotVIPs(snapshot)
	c.Check(vips())
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, period, vips)
	}()
	return func() { cancel(); <-done }
}

// snapshotVIPs returns a func that lists the VIPs of the current snapshot,
// sorted and each once, listing them anew only when the snapshot's
// revision changed.
func snapshotVIPs(snapshot func() *store.Snapshot) func() []netip.Addr {
	var (
		rev  uint64
		vips []netip.Addr
		done bool
	)
	return func() []netip.Addr {
		snap := snapshot()
		if done && snap.Revision() == rev {
			return vips
		}
		vips = listVIPs(snap)
		rev, done = snap.Revision(), true
		return vips
	}
}

// listVIPs returns the VIPs of snap's services, sorted and each once. It
// sizes the list up front (appending made garbage of several times the
// list's 2.4 MB at 100,000 services) and keeps no more than it holds:
// services often share a VIP.
func listVIPs(snap *store.Snapshot) []netip.Addr {
	n := 0
	for _, e := range snap.Each() {
		n += len(e.Dataplane.VIPs)
	}
	vips := make([]netip.Addr, 0, n)
	for _, e := range snap.Each() {
		vips = append(vips, e.Dataplane.VIPs...)
	}
	slices.SortFunc(vips, netip.Addr.Compare)
	if vips = slices.Compact(vips); len(vips) < cap(vips)*3/4 {
		vips = append(make([]netip.Addr, 0, len(vips)), vips...)
	}
	return vips
}

// statusWarnings is c's warnings for GetStatus.
func statusWarnings(c *nodecheck.Checker) func() []*vipdv1.StatusWarning {
	return func() []*vipdv1.StatusWarning {
		var out []*vipdv1.StatusWarning
		for _, w := range c.Warnings() {
			out = append(out, &vipdv1.StatusWarning{Check: w.Check, Message: w.Message, Remedy: w.Remedy, Since: timestamppb.New(w.Since)})
		}
		return out
	}
}
