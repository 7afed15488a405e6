package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/vipd/vipd/dataplane"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// conntrackCleaner deletes the conntrack entries that would otherwise keep UDP
// clients stuck after a change. TCP entries are never touched: an
// established TCP connection keeps its backend until it closes, even when the
// backend is removed, as with kube-proxy.
type conntrackCleaner struct {
	log hclog.Logger
	ns  netns.NsHandle // -1 for the current namespace

	// deleted remembers for deletionMemory why the cleaner deleted each
	// entry, by conntrack ID, so that the flow source can tell the DESTROY
	// events it caused from those of someone else's deletes.
	mu      sync.Mutex
	deleted map[uint32]deletion
}

// deletion is why, and when, the cleaner deleted a conntrack entry.
type deletion struct {
	reason string // dataplane.CloseBackendRemoved or CloseServiceRemoved
	at     time.Time
}

// deletionMemory is how long a deletion is remembered: far longer than a
// flow reader takes to read the DESTROY event it causes.
const deletionMemory = 2 * time.Minute

func newConntrackCleaner(log hclog.Logger, nsPath string) (*conntrackCleaner, error) {
	c := &conntrackCleaner{log: log, ns: -1, deleted: map[uint32]deletion{}}
	if nsPath != "" {
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
		}
		c.ns = h
	}
	return c, nil
}

// netlinkConfig dials netlink sockets in the dataplane's namespace.
func (c *conntrackCleaner) netlinkConfig() *mdnetlink.Config {
	cfg := &mdnetlink.Config{}
	if c.ns >= 0 {
		cfg.NetNS = int(c.ns)
	}
	return cfg
}

// remember records that the entry with conntrack ID id is about to be
// deleted for reason.
func (c *conntrackCleaner) remember(id uint32, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted[id] = deletion{reason, time.Now()}
}

// prune forgets deletions older than deletionMemory.
func (c *conntrackCleaner) prune() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, d := range c.deleted {
		if time.Since(d.at) > deletionMemory {
			delete(c.deleted, id)
		}
	}
}

func (c *conntrackCleaner) forget(id uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.deleted, id)
}

// deletedBy returns why the cleaner deleted the entry with conntrack ID id,
// if it did. Several flow readers may ask about the same entry.
func (c *conntrackCleaner) deletedBy(id uint32) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deleted[id]
	return d.reason, ok
}

func (c *conntrackCleaner) close() error {
	if c.ns >= 0 {
		return c.ns.Close()
	}
	return nil
}

// udpTarget is one UDP VIP:port and the backend address a flow to it was
// DNATed to. A zero backend means "no DNAT": the flow was to a service
// without backends.
type udpTarget struct {
	vip     netip.AddrPort
	backend netip.AddrPort
}

// staleUDP lists what to delete when moving from old to next (each a
// map of services with the node-port addresses of its Node): flows of a
// removed UDP frontend (VIP, external or LB IP, or node-port address and
// node port, with the port); flows to a backend that is no longer in a
// UDP port's backend set (removed, no longer serving the port, or with
// another target port); and un-DNATed flows of a UDP frontend that had no
// eligible backend and now has one.
func staleUDP(old, next udpView) (flows map[udpTarget]bool, whole map[netip.AddrPort]bool) {
	flows, whole = map[udpTarget]bool{}, map[netip.AddrPort]bool{}
	targets := func(v udpView) (map[netip.AddrPort]map[netip.AddrPort]bool, map[netip.AddrPort]bool) {
		backends := map[netip.AddrPort]map[netip.AddrPort]bool{}
		eligible := map[netip.AddrPort]bool{}
		for _, svc := range v.services {
			for _, p := range svc.Ports {
				if p.Protocol != dataplane.UDP {
					continue
				}
				for _, fe := range frontends(svc, p, v.nodePorts) {
					set := map[netip.AddrPort]bool{}
					for i := range svc.Backends {
						b := &svc.Backends[i]
						if b.IP.Is4() == fe.addr.Addr().Is4() && b.Serves(p) {
							set[netip.AddrPortFrom(b.IP, b.TargetPort(p))] = true
						}
					}
					backends[fe.addr] = set
					if fe.external {
						eligible[fe.addr] = len(svc.ExternalBackends(p, fe.addr.Addr().Is6(), dataplane.TrafficPolicyCluster)) > 0
					} else {
						eligible[fe.addr] = len(svc.EligibleBackends(p, fe.addr.Addr().Is6())) > 0
					}
				}
			}
		}
		return backends, eligible
	}
	oldB, oldE := targets(old)
	newB, newE := targets(next)
	for key, set := range oldB {
		nset, ok := newB[key]
		if !ok {
			whole[key] = true
			continue
		}
		for be := range set {
			if !nset[be] {
				flows[udpTarget{key, be}] = true
			}
		}
	}
	for key := range newB {
		if newE[key] && !oldE[key] {
			flows[udpTarget{vip: key}] = true
		}
	}
	return flows, whole
}

// udpView is what staleUDP compares: the services and the node-port
// addresses of an applied state.
type udpView struct {
	services  map[string]*dataplane.Service
	nodePorts []netip.Addr
}

// frontend is an address and port that clients reach a service port on;
// external is set for node ports, external and LB IPs.
type frontend struct {
	addr     netip.AddrPort
	external bool
}

// frontends lists where port p of svc is served: on its VIPs, external and
// LB IPs at p.Port, and on the node-port addresses at p.NodePort, in the
// families of its VIPs (as Render serves them).
func frontends(svc *dataplane.Service, p dataplane.Port, nodePorts []netip.Addr) []frontend {
	var out []frontend
	families := map[bool]bool{}
	for _, v := range svc.VIPs {
		out = append(out, frontend{netip.AddrPortFrom(v, p.Port), false})
		families[v.Is6()] = true
	}
	for _, a := range slices.Concat(svc.ExternalIPs, svc.LoadBalancerIPs) {
		if families[a.Is6()] {
			out = append(out, frontend{netip.AddrPortFrom(a, p.Port), true})
		}
	}
	if p.NodePort != 0 {
		for _, a := range nodePorts {
			if families[a.Is6()] {
				out = append(out, frontend{netip.AddrPortFrom(a, p.NodePort), true})
			}
		}
	}
	return out
}

// cleanup deletes the stale UDP entries between two applied states. It logs
// failures instead of failing the apply: the rules are already in force, and
// a stale UDP entry expires by itself.
func (c *conntrackCleaner) cleanup(old, next udpView) {
	c.prune()
	flows, whole := staleUDP(old, next)
	if len(flows) == 0 && len(whole) == 0 {
		return
	}
	conn, err := conntrack.Dial(c.netlinkConfig())
	if err != nil {
		c.log.Error("open conntrack", "error", err)
		return
	}
	defer conn.Close()
	dump, err := conn.Dump(nil)
	if err != nil {
		c.log.Error("dump conntrack", "error", err)
		return
	}
	deleted := 0
	for _, f := range dump {
		if f.TupleOrig.Proto.Protocol != unix.IPPROTO_UDP {
			continue
		}
		vip := netip.AddrPortFrom(f.TupleOrig.IP.DestinationAddress.Unmap(), f.TupleOrig.Proto.DestinationPort)
		reply := netip.AddrPortFrom(f.TupleReply.IP.SourceAddress.Unmap(), f.TupleReply.Proto.SourcePort)
		target := udpTarget{vip: vip, backend: reply}
		if reply == vip {
			target.backend = netip.AddrPort{}
		}
		reason := dataplane.CloseBackendRemoved
		switch {
		case whole[vip]:
			reason = dataplane.CloseServiceRemoved
		case !flows[target]:
			continue
		}
		// Remembered first: the DESTROY event may be read before Delete returns.
		c.remember(f.ID, reason)
		if err := conn.Delete(f); err != nil {
			c.forget(f.ID)
			c.log.Warn("delete conntrack entry", "flow", f.TupleOrig.String(), "error", err)
			continue
		}
		deleted++
	}
	c.log.Debug("deleted stale UDP conntrack entries", "deleted", deleted, "backends", len(flows), "vips", len(whole))
}
