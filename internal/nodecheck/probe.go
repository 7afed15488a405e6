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

// routeCache keeps route lookups while the namespace's routes and rules
// stay the same, so that a check with many VIPs looks up only new ones.
type routeCache struct {
	// fingerprint hashes the routes of every table and the rules.
	fingerprint uint64
	// why maps a VIP to why it has no usable route, "" when it has one.
	why map[netip.Addr]string
}

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
	path := filepath.Join("/proc/sys", strings.ReplaceAll(s.key, ".", "/"))
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read sysctl %s: %w", s.key, err)
	}
	value = strings.TrimSpace(string(b))
	if value == s.value || !c.cfg.SetSysctls {
		return value, true, nil
	}
	if err := os.WriteFile(path, []byte(s.value), 0); err != nil {
		c.log.Error("--set-sysctls: set sysctl", "sysctl", s.key, "value", s.value, "error", err)
		return value, true, nil
	}
	c.log.Info("--set-sysctls: set sysctl", "sysctl", s.key, "was", value, "value", s.value, "netns", c.cfg.NetNS)
	return s.value, true, nil
}

// lookupRoutes returns, for each VIP, why it has no usable route ("" when
// it has one), asking the kernel only about VIPs that the cache does not
// know for the namespace's current routes and rules. It runs in the
// namespace.
func (c *Checker) lookupRoutes(vips []netip.Addr) (map[netip.Addr]string, error) {
	h, err := netlink.NewHandleAt(netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	fp, err := routingFingerprint(h)
	if err != nil {
		return nil, err
	}
	if fp != c.routes.fingerprint || c.routes.why == nil {
		c.routes = routeCache{fingerprint: fp, why: map[netip.Addr]string{}}
	}
	out := make(map[netip.Addr]string, len(vips))
	for _, vip := range vips {
		why, ok := c.routes.why[vip]
		if !ok {
			if why, err = lookupRoute(h, vip); err != nil {
				return nil, err
			}
		}
		out[vip] = why
	}
	// The cache keeps the current VIPs only.
	c.routes.why = out
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

// routingFingerprint hashes what decides a route lookup: the routes of
// every table and the policy rules, of both families.
func routingFingerprint(h *netlink.Handle) (uint64, error) {
	hash := fnv.New64a()
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return 0, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		fmt.Fprintf(hash, "%s type %d prio %d scope %d; ", r, r.Type, r.Priority, r.Scope)
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("list rules: %w", err)
	}
	for _, r := range rules {
		fmt.Fprintf(hash, "%s mark %d/%v iif %s oif %s invert %v goto %d; ", r, r.Mark, r.Mask, r.IifName, r.OifName, r.Invert, r.Goto)
	}
	return hash.Sum64(), nil
}
