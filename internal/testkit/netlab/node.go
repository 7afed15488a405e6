package netlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Node is a node namespace, where vipd runs. Its uplink eth0 is a fabric
// link to the upstream router; each of its pods hangs off a host veth.
type Node struct {
	*NS
	lab   *Lab
	index int

	// Guarded by lab.mu.
	pods      []*Pod
	nextHost  int
	secondary bool // AddSecondaryAddresses has added them
}

// Index returns k, the node's number: node k is Lab.Node(k), its namespace
// name ends in "-node<k>", and its pods live in 198.18.k.0/24.
func (n *Node) Index() int { return n.index }

// IPv4 returns the node's address on its uplink.
func (n *Node) IPv4() netip.Addr { return fabricNodeV4(n.index).Addr() }

// IPv6 returns the node's IPv6 address on its uplink.
func (n *Node) IPv6() netip.Addr { return fabricNodeV6(n.index).Addr() }

// PodCIDRv4 returns the range the node's pods get their IPv4 addresses from.
func (n *Node) PodCIDRv4() netip.Prefix { return podCIDRv4(n.index) }

// PodCIDRv6 returns the range the node's pods get their IPv6 addresses from.
func (n *Node) PodCIDRv6() netip.Prefix { return podCIDRv6(n.index) }

// Uplink returns the name of the node's fabric link, "eth0".
func (n *Node) Uplink() string { return uplinkName }

// Pod returns the node's pod called name, or nil if it has none.
func (n *Node) Pod(name string) *Pod {
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	i := slices.IndexFunc(n.pods, func(p *Pod) bool { return p.name == name })
	if i < 0 {
		return nil
	}
	return n.pods[i]
}

// Pods returns the node's pods in the order they were added.
func (n *Node) Pods() []*Pod {
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	return slices.Clone(n.pods)
}

// StartEcho starts an echo server called backend on the node's own addresses
// (a host-network backend); see Pod.StartEcho.
func (n *Node) StartEcho(backend string, ports ...uint16) (*Echo, error) {
	return n.startEcho(backend, []netip.Addr{n.IPv4(), n.IPv6()}, ports)
}

// AddPod creates the pod name on the node, with the next free host number,
// and returns it once its addresses and routes are in place. Pod names are
// unique within the lab, at most 11 characters of [a-z0-9-], and start with
// a letter or digit. On error nothing of the pod is left behind.
func (n *Node) AddPod(ctx context.Context, name string) (*Pod, error) {
	l := n.lab
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("add pod %s: %w", name, err)
	}
	if l.closed {
		return nil, fmt.Errorf("add pod %s: %w", name, ErrClosed)
	}
	if err := validPodName(name); err != nil {
		return nil, err
	}
	if l.podLocked(name) != nil {
		return nil, fmt.Errorf("add pod %s: lab already has a pod with that name", name)
	}
	if n.nextHost > lastPodHost {
		return nil, fmt.Errorf("add pod %s: node%d has used all %d pod addresses", name, n.index, lastPodHost-firstPodHost+1)
	}
	ns, err := createNS(l.prefix+"-pod-"+name, l.log)
	if err != nil {
		return nil, fmt.Errorf("add pod %s: %w", name, err)
	}
	p := &Pod{NS: ns, node: n, name: name, host: n.nextHost}
	n.nextHost++
	if err := p.wire(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("add pod %s to node%d: %w", name, n.index, err), p.teardown())
	}
	n.pods = append(n.pods, p)
	l.log.Debug("added pod", "pod", name, "node", n.index, "ipv4", p.IPv4(), "ipv6", p.IPv6())
	return p, nil
}

// RemovePod stops the pod's echo servers and deletes its veth pair (and with
// it the node's routes to the pod) and its namespace. Traffic to the pod's
// addresses is rejected from then on by the node's unreachable route.
func (n *Node) RemovePod(name string) error {
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	i := slices.IndexFunc(n.pods, func(p *Pod) bool { return p.name == name })
	if i < 0 {
		return fmt.Errorf("remove pod %s: node%d has no such pod", name, n.index)
	}
	p := n.pods[i]
	n.pods = slices.Delete(n.pods, i, i+1)
	if err := p.teardown(); err != nil {
		return fmt.Errorf("remove pod %s: %w", name, err)
	}
	return nil
}

// wire connects the node to the upstream router and routes through it.
func (n *Node) wire(ctx context.Context) error {
	up, k := n.lab.upstream, n.index
	if err := n.enableForwarding(); err != nil {
		return err
	}
	fabric := n.routerLink()
	if err := n.addVeth(uplinkName, nodeIndexBase, up, fabric); err != nil {
		return err
	}
	uplink, err := n.configureLink(uplinkName, fabricNodeV4(k), fabricNodeV6(k))
	if err != nil {
		return err
	}
	err = n.addRoutes(
		route(anyV4, uplink.Attrs().Index, fabricUpstreamV4(k).Addr()),
		route(anyV6, uplink.Attrs().Index, fabricUpstreamV6(k).Addr()),
		// Without these, a packet to an unassigned pod address would bounce
		// between node and router until its TTL ran out.
		unreachable(podCIDRv4(k)),
		unreachable(podCIDRv6(k)),
	)
	if err != nil {
		return err
	}
	down, err := up.configureLink(fabric, fabricUpstreamV4(k), fabricUpstreamV6(k))
	if err != nil {
		return err
	}
	err = up.addRoutes(
		route(podCIDRv4(k), down.Attrs().Index, fabricNodeV4(k).Addr()),
		route(podCIDRv6(k), down.Attrs().Index, fabricNodeV6(k).Addr()),
	)
	if err != nil {
		return err
	}
	if err := n.waitReady(ctx, uplinkName, fabricNodeV4(k).Addr(), fabricNodeV6(k).Addr()); err != nil {
		return err
	}
	return up.waitReady(ctx, fabric, fabricUpstreamV4(k).Addr(), fabricUpstreamV6(k).Addr())
}

// teardown removes the node's pods, its fabric link and its namespace.
// The caller holds lab.mu.
func (n *Node) teardown() error {
	var errs []error
	for _, p := range n.pods {
		errs = append(errs, p.teardown())
	}
	n.pods = nil
	errs = append(errs, n.delLink(uplinkName), n.close())
	return errors.Join(errs...)
}

// enableForwarding makes the namespace route between its interfaces.
func (ns *NS) enableForwarding() error {
	return ns.setSysctls(
		sysctl{"net.ipv4.ip_forward", "1"},
		sysctl{"net.ipv6.conf.all.forwarding", "1"},
	)
}

// Pod is a pod namespace on a node. Its only interface besides lo is eth0,
// with one IPv4 /32 and one IPv6 /128, and default routes through the node.
type Pod struct {
	*NS
	node *Node
	name string
	host int
}

// PodName returns the pod's name, as given to AddPod or in NodeSpec.Pods.
// (Name, from NS, returns the namespace's name.)
func (p *Pod) PodName() string { return p.name }

// Node returns the node the pod runs on.
func (p *Pod) Node() *Node { return p.node }

// IPv4 returns the pod's IPv4 address, 198.18.k.h.
func (p *Pod) IPv4() netip.Addr { return podIPv4(p.node.index, p.host) }

// IPv6 returns the pod's IPv6 address, fd00:198:k::h.
func (p *Pod) IPv6() netip.Addr { return podIPv6(p.node.index, p.host) }

// HostVeth returns the name of the pod's veth in the node namespace,
// "veth<pod>".
func (p *Pod) HostVeth() string { return vethPrefix + p.name }

// StartEcho starts an echo server called backend (the pod's name if empty)
// on the given ports of the pod's IPv4 and IPv6 addresses, over TCP and UDP.
// It runs until Echo.Close, RemovePod or Lab.Close. See Echo for the protocol.
func (p *Pod) StartEcho(backend string, ports ...uint16) (*Echo, error) {
	if backend == "" {
		backend = p.name
	}
	return p.startEcho(backend, []netip.Addr{p.IPv4(), p.IPv6()}, ports)
}

// wire connects the pod to its node and routes through it.
func (p *Pod) wire(ctx context.Context) error {
	n, veth := p.node, p.HostVeth()
	if err := n.addVeth(veth, nodeIndexBase+p.host, p.NS, podIfName); err != nil {
		return err
	}
	// Proxy ARP makes the node answer for podGatewayV4; with the default
	// proxy_delay it would answer only after a random delay of up to 0.8 s.
	err := n.setSysctls(
		sysctl{"net.ipv4.conf." + veth + ".proxy_arp", "1"},
		sysctl{"net.ipv4.neigh." + veth + ".proxy_delay", "0"},
	)
	if err != nil {
		return err
	}
	host, err := n.configureLink(veth, netip.PrefixFrom(podGatewayV6, 64))
	if err != nil {
		return err
	}
	err = n.addRoutes(
		route(netip.PrefixFrom(p.IPv4(), 32), host.Attrs().Index, netip.Addr{}),
		route(netip.PrefixFrom(p.IPv6(), 128), host.Attrs().Index, netip.Addr{}),
	)
	if err != nil {
		return err
	}
	eth0, err := p.configureLink(podIfName, netip.PrefixFrom(p.IPv4(), 32), netip.PrefixFrom(p.IPv6(), 128))
	if err != nil {
		return err
	}
	err = p.addRoutes(
		route(netip.PrefixFrom(podGatewayV4, 32), eth0.Attrs().Index, netip.Addr{}),
		route(anyV4, eth0.Attrs().Index, podGatewayV4),
		route(anyV6, eth0.Attrs().Index, podGatewayV6),
	)
	if err != nil {
		return err
	}
	if err := n.waitReady(ctx, veth, podGatewayV6); err != nil {
		return err
	}
	return p.waitReady(ctx, podIfName, p.IPv4(), p.IPv6())
}

// teardown deletes the pod's veth pair and namespace. Deleting the host veth
// explicitly, rather than leaving it to the namespace's destruction, makes
// the node's routes to the pod disappear at once, even if something still
// holds the pod's namespace.
func (p *Pod) teardown() error {
	return errors.Join(p.node.delLink(p.HostVeth()), p.close())
}

func validPodName(name string) error {
	if !podNameRE.MatchString(name) {
		return fmt.Errorf("invalid pod name %q: want 1-11 characters of [a-z0-9-], not starting with '-'", name)
	}
	return nil
}
