package nodecheck

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routeCache keeps the route decisions while the namespace's routes and
// rules stay the same, so that a check with many VIPs decides only new ones.
type routeCache struct {
	// fingerprint hashes the routes of every table and the rules.
	fingerprint uint64
	// fib is the routing decision of the dump that fingerprint hashes.
	fib *fib
	// why maps a VIP to why it has no usable route, "" when it has one,
	// under the current routes and rules.
	why map[netip.Addr]string
	// stale are the answers from before the routes or rules last changed,
	// for VIPs that wait for a kernel lookup (see maxRouteGets).
	stale map[netip.Addr]string
}

// maxRouteGets bounds the kernel route lookups (RouteGet) of one check:
// the VIPs that the in-process decision is not sure of beyond it keep their
// last answer (or none yet) until a later check looks them up.
var maxRouteGets = 500

// probe reads want's sysctls (setting those that are off, with
// SetSysctls) and, when VIP routes are needed, the route of every VIP, on
// a thread inside the checked namespace.
func (c *Checker) probe(want []sysctlReq, vips []netip.Addr) (facts, error) {
	f := facts{sysctls: map[string]string{}}
	err := nsdo.Do(c.cfg.NetNS, func() error {
		for _, s := range want {
			v, ok, err := c.sysctl(s)
			if err != nil {
				return err
			}
			if ok {
				f.sysctls[s.key] = v
			}
		}
		if !c.cfg.Needs.VIPRoutes {
			return nil
		}
		var err error
		f.routes, err = c.lookupRoutes(vips)
		return err
	})
	return f, err
}

// sysctl reads s's key in the current thread's namespace, and sets it
// to s.value first when it differs and SetSysctls is on. ok is false when
// the key does not exist.
func (c *Checker) sysctl(s sysctlReq) (value string, ok bool, err error) {
	path := filepath.Join(c.procSys, strings.ReplaceAll(s.key, ".", "/"))
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read sysctl %s: %w", s.key, err)
	}
	value = strings.TrimSpace(string(b))
	if value == s.value || !c.cfg.SetSysctls {
		delete(c.setFailing, s.key)
		return value, true, nil
	}
	if err := c.writeFile(path, []byte(s.value), 0); err != nil {
		// Once per run of failures: a read-only /proc/sys fails every check.
		if !c.setFailing[s.key] {
			c.setFailing[s.key] = true
			c.log.Error("--set-sysctls: set sysctl; not logged again until it works", "sysctl", s.key, "value", s.value, "error", err)
		} else {
			c.log.Debug("--set-sysctls: set sysctl", "sysctl", s.key, "value", s.value, "error", err)
		}
		return value, true, nil
	}
	delete(c.setFailing, s.key)
	c.log.Info("--set-sysctls: set sysctl", "sysctl", s.key, "was", value, "value", s.value, "netns", c.cfg.NetNS)
	return s.value, true, nil
}

// lookupRoutes returns, for each VIP, why it has no usable route ("" when
// it has one). It lists the namespace's routes and rules once; while they
// stay the same, known VIPs cost a map lookup. Otherwise it decides each
// VIP in-process (fib), and asks the kernel (RouteGet) only about the VIPs
// whose answer depends on what fib does not model, at most maxRouteGets of
// them per check: the others keep the answer they had before the routes
// changed, or have none (and no warning) until a later check. It runs in
// the namespace.
func (c *Checker) lookupRoutes(vips []netip.Addr) (map[netip.Addr]string, error) {
	h, err := netlink.NewHandleAt(netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	routes, rules, err := dumpRouting(h)
	if err != nil {
		return nil, err
	}
	if fp := routingFingerprint(routes, rules); fp != c.routes.fingerprint || c.routes.why == nil {
		stale := c.routes.why
		for vip, why := range c.routes.stale {
			if _, ok := stale[vip]; !ok {
				if stale == nil {
					stale = map[netip.Addr]string{}
				}
				stale[vip] = why
			}
		}
		c.routes = routeCache{fingerprint: fp, fib: newFIB(routes, rules), why: map[netip.Addr]string{}, stale: stale}
	}
	// out is also the next cache: the VIPs in waiting have stale answers.
	out := make(map[netip.Addr]string, len(vips))
	waiting := map[netip.Addr]string{}
	gets := 0
	for _, vip := range vips {
		why, ok := c.routes.why[vip]
		if ok && len(c.routes.stale) > 0 {
			_, wait := c.routes.stale[vip]
			ok = !wait
		}
		if !ok {
			why, ok = c.routes.fib.decide(vip)
		}
		if !ok && gets < maxRouteGets {
			gets++
			c.routeGets++
			if why, err = lookupRoute(h, vip); err != nil {
				return nil, err
			}
			ok = true
		}
		if !ok {
			if old, had := c.routes.stale[vip]; had {
				out[vip] = old
				waiting[vip] = old
			}
			continue
		}
		out[vip] = why
	}
	// The cache keeps the current VIPs only.
	c.routes.why, c.routes.stale = out, waiting
	if len(waiting) > 0 || len(out) < len(vips) {
		c.log.Debug("route check: some VIPs wait for a kernel route lookup", "waiting", len(vips)-len(out)+len(waiting), "looked_up", gets)
	}
	return out, nil
}

// lookupRoute asks the kernel how it routes a packet to vip, and returns
// why it cannot ("" when it routes it to a unicast or local route).
func lookupRoute(h *netlink.Handle, vip netip.Addr) (string, error) {
	routes, err := h.RouteGet(vip.AsSlice())
	switch {
	case errors.Is(err, unix.ENETUNREACH):
		return "no route", nil
	case errors.Is(err, unix.EHOSTUNREACH):
		return "unreachable route", nil
	case errors.Is(err, unix.EINVAL):
		return "blackhole route", nil
	case errors.Is(err, unix.EACCES):
		return "prohibit route", nil
	case err != nil:
		return "", fmt.Errorf("look up the route to %s: %w", vip, err)
	case len(routes) == 0:
		return "no route", nil
	}
	switch routes[0].Type {
	case unix.RTN_UNICAST, unix.RTN_LOCAL:
		return "", nil
	case unix.RTN_BLACKHOLE:
		return "blackhole route", nil
	case unix.RTN_UNREACHABLE:
		return "unreachable route", nil
	case unix.RTN_PROHIBIT:
		return "prohibit route", nil
	}
	return fmt.Sprintf("route of type %d", routes[0].Type), nil
}

// dumpRouting lists the routes of every table and the policy rules, of
// both families.
func dumpRouting(h *netlink.Handle) ([]netlink.Route, []netlink.Rule, error) {
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, fmt.Errorf("list routes: %w", err)
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, fmt.Errorf("list rules: %w", err)
	}
	return routes, rules, nil
}

// routingFingerprint hashes what decides a route lookup: the routes of
// every table and the policy rules.
func routingFingerprint(routes []netlink.Route, rules []netlink.Rule) uint64 {
	hash := fnv.New64a()
	for _, r := range routes {
		fmt.Fprintf(hash, "%s type %d prio %d scope %d flags %d; ", r, r.Type, r.Priority, r.Scope, r.Flags)
	}
	for _, r := range rules {
		mask := "none"
		if r.Mask != nil {
			mask = fmt.Sprint(*r.Mask) // not the pointer, which differs in every dump
		}
		fmt.Fprintf(hash, "%s mark %d/%s iif %s oif %s invert %v goto %d; ", r, r.Mark, mask, r.IifName, r.OifName, r.Invert, r.Goto)
	}
	return hash.Sum64()
}
