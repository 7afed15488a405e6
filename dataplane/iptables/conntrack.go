package iptables

import (
	"fmt"
	"net/netip"
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

// staleUDP lists what to delete when moving from old to next: flows of a
// removed UDP VIP:port; flows to a backend that is no longer in a UDP port's
// backend set (removed, no longer serving the port, or with another target
// port); and un-DNATed flows of a UDP VIP:port that had no eligible backend
// and now has one.
func staleUDP(old, next map[string]*dataplane.Service) (flows map[udpTarget]bool, whole map[netip.AddrPort]bool) {
	flows, whole = map[udpTarget]bool{}, map[netip.AddrPort]bool{}
	targets := func(svcs map[string]*dataplane.Service) (map[netip.AddrPort]map[netip.AddrPort]bool, map[netip.AddrPort]bool) {
		backends := map[netip.AddrPort]map[netip.AddrPort]bool{}
		eligible := map[netip.AddrPort]bool{}
		for _, svc := range svcs {
			for _, p := range svc.Ports {
				if p.Protocol != dataplane.UDP {
					continue
				}
				for _, vip := range svc.VIPs {
					key := netip.AddrPortFrom(vip, p.Port)
					set := map[netip.AddrPort]bool{}
					for i := range svc.Backends {
						b := &svc.Backends[i]
						if b.IP.Is4() == vip.Is4() && b.Serves(p) {
							set[netip.AddrPortFrom(b.IP, b.TargetPort(p))] = true
						}
					}
					backends[key] = set
					eligible[key] = len(svc.EligibleBackends(p, vip.Is6())) > 0
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

// cleanup deletes the stale UDP entries between two applied states. It logs
// failures instead of failing the apply: the rules are already in force, and
// a stale UDP entry expires by itself.
func (c *conntrackCleaner) cleanup(old, next map[string]*dataplane.Service) {
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
