package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/none"
	"github.com/vipd/vipd/internal/hcnodeport"
	"github.com/vipd/vipd/internal/nodenet"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/reconcile"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// checkNodeNet refuses a --nodeport-addresses entry that is not a CIDR, an
// --external-interfaces glob that path.Match cannot use, and a
// --snat-port-range that is not MIN-MAX.
func (c Config) checkNodeNet() []error {
	var errs []error
	if _, err := c.nodePortPrefixes(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.snatPorts(); err != nil {
		errs = append(errs, err)
	}
	for _, g := range c.ExternalInterfaces {
		if g == "" {
			errs = append(errs, fmt.Errorf("--external-interfaces: an empty glob matches no interface"))
			continue
		}
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("--external-interfaces %q: %w", g, err))
		}
	}
	return errs
}

// nodePortPrefixes parses NodePortAddresses, masked.
func (c Config) nodePortPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.NodePortAddresses {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--nodeport-addresses %q: want a CIDR such as 198.18.0.0/16 or fd00::/64: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// nodeNet is the part of a Node that follows the node's network: the
// watcher that hands the reconciler each new dataplane.Node, and the
// health-check node port server that follows what the dataplane applied.
type nodeNet struct {
	log     hclog.Logger
	watcher *nodenet.Watcher   // nil: WithoutNodeNetwork
	initial dataplane.Node     // read at Assemble, before the first apply
	hc      *hcnodeport.Server // nil: not served (see buildNodeNet)
}

// buildNodeNet reads the node's network once, for the reconciler's first
// apply, and builds what follows it. The health-check node port server is
// built unless health checks are off or the node's network is not
// followed (a test vipd in the machine's own namespace must never listen
// on its addresses), or the dataplane programs nothing (a 200 would claim
// traffic that is not forwarded).
func buildNodeNet(log hclog.Logger, cfg Config, dp string, o options) (*nodeNet, error) {
	nn := &nodeNet{log: log}
	if o.noNodeNet {
		nn.initial = o.fixedNode
		return nn, nil
	}
	prefixes, err := cfg.nodePortPrefixes()
	if err != nil {
		return nil, err
	}
	nn.watcher = nodenet.New(log.Named("nodenet"), nodenet.Config{NetNS: cfg.NetNS, NodePortAddresses: prefixes, ExternalInterfaces: cfg.ExternalInterfaces})
	if nn.initial, err = nn.watcher.Read(); err != nil {
		return nil, err
	}
	log.Info("node network", "nodeport_addresses", nn.initial.NodePortAddresses, "external_interfaces", nn.initial.ExternalInterfaces())
	if !o.noHealth && dp != none.Name {
		nn.hc = hcnodeport.New(log.Named("hcnodeport"), cfg.NetNS)
	}
	return nn, nil
}

// reconcileOptions give the reconciler the first Node and, with a
// health-check node port server, the states it follows.
func (nn *nodeNet) reconcileOptions() []reconcile.Option {
	opts := []reconcile.Option{reconcile.WithNode(nn.initial)}
	if nn.hc != nil {
		opts = append(opts, reconcile.WithAppliedHook(nn.hc.Update))
	}
	return opts
}

// statusWarnings is the health-check node port server's warnings for
// GetStatus, or nil without one.
func (nn *nodeNet) statusWarnings() func() []*vipdv1.StatusWarning {
	if nn.hc == nil {
		return nil
	}
	return func() []*vipdv1.StatusWarning {
		var out []*vipdv1.StatusWarning
		for _, w := range nn.hc.Warnings() {
			out = append(out, &vipdv1.StatusWarning{Check: w.Check, Message: w.Message, Remedy: w.Remedy, Since: timestamppb.New(w.Since)})
		}
		return out
	}
}

// start runs the watcher, handing each new Node to rec, and the
// health-check node port server, until the returned stop is called.
func (nn *nodeNet) start(ctx context.Context, rec *reconcile.Reconciler) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if nn.watcher != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nn.watcher.Run(ctx, nn.initial, func(ctx context.Context, node dataplane.Node) { nn.submit(ctx, rec, node) })
		}()
	}
	if nn.hc != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nn.hc.Run(ctx)
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// submit hands node to rec, retrying with backoff while the dataplane
// refuses it (the previous Node stays in force meanwhile), until it is
// applied or ctx ends.
func (nn *nodeNet) submit(ctx context.Context, rec *reconcile.Reconciler, node dataplane.Node) {
	backoff := 100 * time.Millisecond
	for {
		err := rec.SetNode(ctx, node)
		if err == nil || ctx.Err() != nil || errors.Is(err, reconcile.ErrStopped) {
			return
		}
		nn.log.Error("apply the node's network; retrying", "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}
