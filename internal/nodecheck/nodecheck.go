package nodecheck

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Warning is one unmet prerequisite.
type Warning struct {
	// Check is a short, stable identifier of what was checked, such as
	// "sysctl/net.ipv4.ip_forward" or "route/ipv4".
	Check string
	// Message says what is wrong and what it breaks.
	Message string
	// Remedy says exactly what to change, such as
	// "sysctl -w net.ipv4.ip_forward=1".
	Remedy string
	// Since is when the check first failed, of the run of failures that
	// goes on.
	Since time.Time
}

// Needs says which prerequisites apply to the dataplane in use. IPv4
// forwarding always applies, IPv6 forwarding when any VIP is IPv6.
type Needs struct {
	// VIPRoutes: connections to a VIP reach vipd's rules only if a route
	// covers it (iptables, whose REJECT for a service without backends sits
	// after routing).
	VIPRoutes bool
	// Conntrack: the flow source reads netfilter conntrack and needs its
	// accounting, timestamps and events on (iptables).
	Conntrack bool
}

// Config configures a Checker.
type Config struct {
	// NetNS is the path of the network namespace to check, the current one
	// when empty.
	NetNS string
	Needs Needs
	// SetSysctls sets every checked sysctl that is off, instead of only
	// warning, and logs each one set.
	SetSysctls bool
}

// Checker checks the node prerequisites and keeps the unmet ones. Check
// and Run must not be called concurrently; Warnings may be called from any
// goroutine.
type Checker struct {
	log hclog.Logger
	cfg Config
	now func() time.Time

	// routes and routeGets (the kernel route lookups so far, for tests)
	// are touched by Check only.
	routes    routeCache
	routeGets int
	// setFailing are the sysctls that SetSysctls failed to set at the last
	// check, whose failure is logged once per run; touched by Check only.
	setFailing map[string]bool
	// procSys and writeFile are /proc/sys and os.WriteFile, but in tests.
	procSys   string
	writeFile func(name string, data []byte, perm os.FileMode) error

	mu       sync.Mutex
	warnings map[string]Warning // by Check
}

// New returns a Checker that has found nothing yet.
func New(log hclog.Logger, cfg Config) *Checker {
	return &Checker{log: log, cfg: cfg, now: time.Now, warnings: map[string]Warning{},
		setFailing: map[string]bool{}, procSys: "/proc/sys", writeFile: os.WriteFile}
}

// Warnings returns the unmet prerequisites of the last Check, sorted by
// Check.
func (c *Checker) Warnings() []Warning {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Warning, 0, len(c.warnings))
	for _, w := range c.warnings {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Warning) int { return cmp.Compare(a.Check, b.Check) })
	return out
}

// Run checks every period until ctx ends, each time against the VIPs vips
// returns. A zero period returns at once. Call Check first for a check at
// start.
func (c *Checker) Run(ctx context.Context, period time.Duration, vips func() []netip.Addr) {
	if period <= 0 {
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Check(vips())
		}
	}
}

// Check reads the prerequisites for vips in the namespace, sets the
// sysctls that are off when configured to, and replaces the warnings with
// what is unmet now: a new warning is logged at warn level, one that
// cleared at info level. A check that could not read the namespace is a
// warning of its own ("nodecheck").
func (c *Checker) Check(vips []netip.Addr) {
	hasIPv6 := slices.ContainsFunc(vips, func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() })
	want := required(c.cfg.Needs, hasIPv6)
	f, err := c.probe(want, vips)
	var found []Warning
	if err != nil {
		found = []Warning{{
			Check:   "nodecheck",
			Message: fmt.Sprintf("node prerequisites could not be checked: %v", err),
			Remedy:  "see vipd's log",
		}}
	} else {
		found = evaluate(f, want, c.remedyPrefix())
	}
	c.update(found)
}

// update replaces the warnings with found, keeping the Since of those that
// persist, and logs what appeared and what cleared.
func (c *Checker) update(found []Warning) {
	now := c.now()
	next := make(map[string]Warning, len(found))
	c.mu.Lock()
	prev := c.warnings
	for _, w := range found {
		if old, ok := prev[w.Check]; ok {
			w.Since = old.Since
		} else {
			w.Since = now
			c.log.Warn("node prerequisite unmet: "+w.Message, "check", w.Check, "remedy", w.Remedy)
		}
		next[w.Check] = w
	}
	for id, w := range prev {
		if _, ok := next[id]; !ok {
			c.log.Info("node prerequisite met again", "check", id, "unmet_for", now.Sub(w.Since).Round(time.Millisecond))
		}
	}
	c.warnings = next
	c.mu.Unlock()
}

// remedyPrefix is what runs a command in the checked namespace: nothing
// for the current one, `ip netns exec NAME ` for one under /run/netns, and
// nsenter otherwise.
func (c *Checker) remedyPrefix() string {
	switch {
	case c.cfg.NetNS == "":
		return ""
	case filepath.Dir(c.cfg.NetNS) == "/run/netns":
		return "ip netns exec " + filepath.Base(c.cfg.NetNS) + " "
	}
	return "nsenter --net=" + c.cfg.NetNS + " "
}

// sysctlReq is one sysctl that must hold a value, and why.
type sysctlReq struct {
	key, value string
	// why completes "KEY is V, want W: " in a warning.
	why string
}

// required lists the sysctls needs asks for.
func required(needs Needs, hasIPv6 bool) []sysctlReq {
	out := []sysctlReq{{"net.ipv4.ip_forward", "1",
		"the node does not forward IPv4, so connections from pods through a VIP to a backend cannot leave it"}}
	if hasIPv6 {
		out = append(out, sysctlReq{"net.ipv6.conf.all.forwarding", "1",
			"the node does not forward IPv6, so connections from pods through an IPv6 VIP to a backend cannot leave it"})
	}
	if needs.Conntrack {
		out = append(out,
			sysctlReq{"net.netfilter.nf_conntrack_acct", "1", "flows lack byte and packet counts"},
			sysctlReq{"net.netfilter.nf_conntrack_timestamp", "1", "flows lack start times and durations"},
			sysctlReq{"net.netfilter.nf_conntrack_events", "1", "flows that start while no WatchFlows stream is open never report their close"},
		)
	}
	return out
}

// facts is what one probe read in the namespace.
type facts struct {
	// sysctls maps each required key to its value; a key that is missing
	// has no file (its module is not loaded).
	sysctls map[string]string
	// routes maps each VIP (when routes are checked) to why it has no
	// usable route, or to "" when it has one.
	routes map[netip.Addr]string
}

// maxListed bounds the VIPs a route warning names.
const maxListed = 5

// evaluate turns facts into warnings (without Since), sorted by Check.
// prefix runs a remedy's command in the checked namespace.
func evaluate(f facts, want []sysctlReq, prefix string) []Warning {
	var out []Warning
	for _, s := range want {
		got, ok := f.sysctls[s.key]
		w := Warning{Check: "sysctl/" + s.key, Remedy: fmt.Sprintf("%ssysctl -w %s=%s (or start vipd with --set-sysctls)", prefix, s.key, s.value)}
		switch {
		case !ok && strings.HasPrefix(s.key, "net.netfilter."):
			w.Message = fmt.Sprintf("%s does not exist, because netfilter conntrack is not loaded: %s", s.key, s.why)
			w.Remedy = "modprobe nf_conntrack, then " + w.Remedy
		case !ok:
			w.Message = fmt.Sprintf("%s does not exist: %s", s.key, s.why)
		case got != s.value:
			w.Message = fmt.Sprintf("%s is %s, want %s: %s", s.key, got, s.value, s.why)
		default:
			continue
		}
		out = append(out, w)
	}
	for _, family := range []string{"ipv4", "ipv6"} {
		if w, ok := routeWarning(f.routes, family, prefix); ok {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b Warning) int { return cmp.Compare(a.Check, b.Check) })
	return out
}

// routeWarning is the warning about the VIPs of family ("ipv4" or "ipv6")
// that have no usable route, if any: it names the first few of them and
// counts the rest, and suggests a route for the smallest prefix that
// covers them all.
func routeWarning(routes map[netip.Addr]string, family, prefix string) (Warning, bool) {
	var missing []netip.Addr
	for vip, why := range routes {
		if why != "" && (vip.Is4() == (family == "ipv4")) {
			missing = append(missing, vip)
		}
	}
	if len(missing) == 0 {
		return Warning{}, false
	}
	slices.SortFunc(missing, netip.Addr.Compare)
	var listed []string
	for _, vip := range missing[:min(len(missing), maxListed)] {
		listed = append(listed, fmt.Sprintf("%s (%s)", vip, routes[vip]))
	}
	more := ""
	if n := len(missing) - len(listed); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	noun := "VIPs have"
	if len(missing) == 1 {
		noun = "VIP has"
	}
	ip := "ip"
	if family == "ipv6" {
		ip = "ip -6"
	}
	return Warning{
		Check: "route/" + family,
		Message: fmt.Sprintf("%d %s no usable route, so connections to them fail or hang before vipd's rules forward or reject them: %s%s",
			len(missing), noun, strings.Join(listed, ", "), more),
		Remedy: fmt.Sprintf("%s%s route add %s dev <the node's uplink interface>, or a route (such as the default route) that covers the service CIDR; a blackhole, unreachable or prohibit route does not do",
			prefix, ip, covering(missing)),
	}, true
}

// covering is the smallest prefix that holds every address of addrs, which
// are all of one family and sorted.
func covering(addrs []netip.Addr) netip.Prefix {
	first, last := addrs[0], addrs[len(addrs)-1]
	bits := first.BitLen()
	for ; bits > 0; bits-- {
		p := netip.PrefixFrom(first, bits).Masked()
		if p.Contains(last) {
			return p
		}
	}
	return netip.PrefixFrom(first, 0).Masked()
}
