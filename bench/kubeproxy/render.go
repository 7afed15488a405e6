package kubeproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"
)

// Service is one port of one ClusterIP service, as kube-proxy's
// ServicePortName sees it, with its ready endpoints.
type Service struct {
	Namespace, Name string
	// PortName is the service port's name; it may be empty.
	PortName string
	VIP      netip.Addr
	Port     uint16
	// Protocol is "tcp", "udp" or "sctp" (any case, as kube-proxy
	// lowercases it).
	Protocol string
	// NodePort is the service port's node port, or 0 for none. A service
	// with a node port gets kube-proxy's external half (policy Cluster):
	// a KUBE-NODEPORTS rule that jumps to its KUBE-EXT chain, which marks
	// the packet for masquerade and jumps to the KUBE-SVC chain.
	NodePort uint16
	// Endpoints are the ready endpoints, in the order kube-proxy would
	// write them.
	Endpoints []netip.AddrPort
}

// Chain names and constants as kube-proxy has them.
const (
	kubeServices         = "KUBE-SERVICES"
	kubeExternalServices = "KUBE-EXTERNAL-SERVICES"
	kubeNodePorts        = "KUBE-NODEPORTS"
	kubePostrouting      = "KUBE-POSTROUTING"
	kubeMarkMasq         = "KUBE-MARK-MASQ"
	kubeForward          = "KUBE-FORWARD"
	kubeProxyFirewall    = "KUBE-PROXY-FIREWALL"
	// kubeletFirewall is kubelet's chain, which kube-proxy duplicates
	// because it enables localhost NodePorts (its default).
	kubeletFirewall = "KUBE-FIREWALL"

	// largeClusterEndpointsThreshold is the number of endpoints above which
	// kube-proxy drops the comments of its SVC→SEP and SEP rules.
	largeClusterEndpointsThreshold = 1000
)

// masqueradeMark is kube-proxy's default mark (--iptables-masquerade-bit
// 14), formatted as kube-proxy formats it.
var masqueradeMark = fmt.Sprintf("%#08x", 1<<14)

// portName returns kube-proxy's ServicePortName string: "ns/name:port", or
// "ns/name" for an unnamed port.
func (s *Service) portName() string {
	if s.PortName == "" {
		return s.Namespace + "/" + s.Name
	}
	return s.Namespace + "/" + s.Name + ":" + s.PortName
}

func (s *Service) protocol() string { return strings.ToLower(s.Protocol) }

// SVCChain returns the service's KUBE-SVC-<hash> chain, as kube-proxy's
// servicePortPolicyClusterChain names it.
func (s *Service) SVCChain() string {
	return "KUBE-SVC-" + hash16(s.portName()+s.protocol())
}

// EXTChain returns the service's KUBE-EXT-<hash> chain, as kube-proxy's
// serviceExternalChainName names it (the hash is the KUBE-SVC chain's).
func (s *Service) EXTChain() string {
	return "KUBE-EXT-" + hash16(s.portName()+s.protocol())
}

// SEPChain returns the KUBE-SEP-<hash> chain of endpoint ep of the service,
// as kube-proxy's servicePortEndpointChainName names it.
func (s *Service) SEPChain(ep netip.AddrPort) string {
	return "KUBE-SEP-" + hash16(s.portName()+s.protocol()+ep.String())
}

func hash16(s string) string {
	h := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(h[:])[:16]
}

// probability returns the statistic match's probability for the first of n
// remaining endpoints, formatted as kube-proxy formats it.
func probability(n int) string {
	return fmt.Sprintf("%0.10f", 1.0/float64(n))
}

// Full renders an iptables-restore input with kube-proxy's complete ruleset
// for svcs, filter table first and nat table second as kube-proxy writes
// them, with the services in the order given (so a caller that puts the
// service under test last makes its packets walk all of KUBE-SERVICES).
//
// Unlike kube-proxy's own payload, it also holds the jump rules from the
// built-in chains (kube-proxy installs them with separate iptables -I
// calls), in the order they end up on a node. It is therefore meant for a
// flushing restore (Restore with noflush false) into a namespace that has
// no other rules; restored with --noflush, it would append a second copy
// of each jump.
func Full(svcs []Service, clusterCIDR netip.Prefix) []byte {
	r := newRenderer(svcs, clusterCIDR)
	var b bytes.Buffer
	r.filter(&b, true)
	r.nat(&b, true, func(int) bool { return true }, nil)
	return b.Bytes()
}

// Partial renders the iptables-restore --noflush input of kube-proxy's
// partial sync after the endpoints of svcs[changed] changed from old to
// svcs[changed].Endpoints, all other services unchanged. Like kube-proxy it
// rewrites the whole filter table's kube-proxy chains, the four top-level
// nat chains (KUBE-SERVICES with one rule per service that has endpoints),
// the changed service's KUBE-SVC chain and the KUBE-SEP chains of all its
// current endpoints; the chains of endpoints that are gone (and the
// KUBE-SVC chain, if no endpoint is left) are flushed and deleted (-X).
//
// kube-proxy finds those stale chains with an iptables-save of the nat
// table before the restore, and in a cluster with over 1000 endpoints only
// once per sync period; that read is not part of this payload.
func Partial(svcs []Service, changed int, old []netip.AddrPort, clusterCIDR netip.Prefix) []byte {
	r := newRenderer(svcs, clusterCIDR)
	s := &svcs[changed]
	current := make(map[string]bool, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		current[s.SEPChain(ep)] = true
	}
	var stale []string
	for _, ep := range old {
		if c := s.SEPChain(ep); !current[c] {
			stale = append(stale, c)
		}
	}
	if len(old) > 0 && len(s.Endpoints) == 0 {
		stale = append(stale, s.SVCChain())
		if s.NodePort != 0 {
			stale = append(stale, s.EXTChain())
		}
	}
	var b bytes.Buffer
	r.filter(&b, false)
	r.nat(&b, false, func(i int) bool { return i == changed }, stale)
	return b.Bytes()
}

type renderer struct {
	svcs        []Service
	clusterCIDR netip.Prefix
	// large is kube-proxy's largeClusterMode.
	large bool
}

func newRenderer(svcs []Service, clusterCIDR netip.Prefix) *renderer {
	n := 0
	for i := range svcs {
		n += len(svcs[i].Endpoints)
	}
	return &renderer{svcs: svcs, clusterCIDR: clusterCIDR, large: n > largeClusterEndpointsThreshold}
}

// hook is a jump from a built-in chain that kube-proxy (or, for
// KUBE-FIREWALL, kubelet) installs outside its restore.
type hook struct {
	table, from, args, to string
}

// hooks lists the jumps in the order they end up in each built-in chain:
// kube-proxy inserts each at the top (iptables -I) in the reverse of this
// order, after kubelet has installed its KUBE-FIREWALL jumps.
var hooks = []hook{
	{"filter", "INPUT", `-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall"`, kubeProxyFirewall},
	{"filter", "INPUT", `-m comment --comment "kubernetes health check service ports"`, kubeNodePorts},
	{"filter", "INPUT", `-m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals"`, kubeExternalServices},
	{"filter", "INPUT", "", kubeletFirewall},
	{"filter", "FORWARD", `-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall"`, kubeProxyFirewall},
	{"filter", "FORWARD", `-m comment --comment "kubernetes forwarding rules"`, kubeForward},
	{"filter", "FORWARD", `-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals"`, kubeServices},
	{"filter", "FORWARD", `-m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals"`, kubeExternalServices},
	{"filter", "OUTPUT", `-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall"`, kubeProxyFirewall},
	{"filter", "OUTPUT", `-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals"`, kubeServices},
	{"filter", "OUTPUT", "", kubeletFirewall},
	{"nat", "PREROUTING", `-m comment --comment "kubernetes service portals"`, kubeServices},
	{"nat", "OUTPUT", `-m comment --comment "kubernetes service portals"`, kubeServices},
	{"nat", "POSTROUTING", `-m comment --comment "kubernetes postrouting rules"`, kubePostrouting},
}

func writeHooks(b *bytes.Buffer, table string) {
	for _, h := range hooks {
		if h.table != table {
			continue
		}
		if h.args == "" {
			fmt.Fprintf(b, "-A %s -j %s\n", h.from, h.to)
		} else {
			fmt.Fprintf(b, "-A %s %s -j %s\n", h.from, h.args, h.to)
		}
	}
}

func chainLine(b *bytes.Buffer, chain string) {
	fmt.Fprintf(b, ":%s - [0:0]\n", chain)
}

// match returns kube-proxy's "-m proto -p proto -d VIP --dport PORT".
func (s *Service) match() string {
	p := s.protocol()
	return fmt.Sprintf("-m %s -p %s -d %s --dport %d", p, p, s.VIP, s.Port)
}

// filter writes the *filter section, which kube-proxy rewrites in full on
// every sync.
func (r *renderer) filter(b *bytes.Buffer, withHooks bool) {
	b.WriteString("*filter\n")
	for _, c := range []string{kubeServices, kubeExternalServices, kubeForward, kubeNodePorts, kubeProxyFirewall, kubeletFirewall} {
		chainLine(b, c)
	}
	if withHooks {
		writeHooks(b, "filter")
	}
	b.WriteString(`-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP` + "\n")
	for i := range r.svcs {
		s := &r.svcs[i]
		if len(s.Endpoints) == 0 {
			fmt.Fprintf(b, "-A %s -m comment --comment \"%s has no endpoints\" %s -j REJECT\n", kubeServices, s.portName(), s.match())
			if s.NodePort != 0 {
				p := s.protocol()
				fmt.Fprintf(b, "-A %s -m comment --comment \"%s has no endpoints\" -m addrtype --dst-type LOCAL -m %s -p %s --dport %d -j REJECT\n",
					kubeExternalServices, s.portName(), p, p, s.NodePort)
			}
		}
	}
	b.WriteString("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n")
	fmt.Fprintf(b, "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark %s/%s -j ACCEPT\n", masqueradeMark, masqueradeMark)
	b.WriteString(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT` + "\n")
	b.WriteString("COMMIT\n")
}

// nat writes the *nat section: chain lines first, then rules, as kube-proxy
// does. Services for which write is false get only their KUBE-SERVICES rule
// (a partial sync skips their chains); stale chains are flushed and deleted.
func (r *renderer) nat(b *bytes.Buffer, withHooks bool, write func(int) bool, stale []string) {
	b.WriteString("*nat\n")
	for _, c := range []string{kubeServices, kubeNodePorts, kubePostrouting, kubeMarkMasq} {
		chainLine(b, c)
	}
	for i := range r.svcs {
		s := &r.svcs[i]
		if len(s.Endpoints) == 0 || !write(i) {
			continue
		}
		chainLine(b, s.SVCChain())
		if s.NodePort != 0 {
			chainLine(b, s.EXTChain())
		}
		for _, ep := range s.Endpoints {
			chainLine(b, s.SEPChain(ep))
		}
	}
	for _, c := range stale {
		// Declaring a chain flushes it; -X fails on a chain with rules.
		chainLine(b, c)
	}
	if withHooks {
		writeHooks(b, "nat")
	}
	fmt.Fprintf(b, "-A %s -m mark ! --mark %s/%s -j RETURN\n", kubePostrouting, masqueradeMark, masqueradeMark)
	fmt.Fprintf(b, "-A %s -j MARK --xor-mark %s\n", kubePostrouting, masqueradeMark)
	fmt.Fprintf(b, "-A %s -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n", kubePostrouting)
	fmt.Fprintf(b, "-A %s -j MARK --or-mark %s\n", kubeMarkMasq, masqueradeMark)
	for i := range r.svcs {
		s := &r.svcs[i]
		if len(s.Endpoints) == 0 {
			continue
		}
		svc := s.SVCChain()
		clusterIP := fmt.Sprintf("-m comment --comment \"%s cluster IP\" %s", s.portName(), s.match())
		fmt.Fprintf(b, "-A %s %s -j %s\n", kubeServices, clusterIP, svc)
		if s.NodePort != 0 {
			p := s.protocol()
			fmt.Fprintf(b, "-A %s -m comment --comment %s -m %s -p %s --dport %d -j %s\n", kubeNodePorts, s.portName(), p, p, s.NodePort, s.EXTChain())
		}
		if !write(i) {
			continue
		}
		fmt.Fprintf(b, "-A %s %s ! -s %s -j %s\n", svc, clusterIP, r.clusterCIDR, kubeMarkMasq)
		if s.NodePort != 0 {
			// External traffic policy Cluster: masquerade whatever comes
			// from outside, as the endpoint may be on another node.
			ext := s.EXTChain()
			fmt.Fprintf(b, "-A %s -m comment --comment \"masquerade traffic for %s external destinations\" -j %s\n", ext, s.portName(), kubeMarkMasq)
			fmt.Fprintf(b, "-A %s -j %s\n", ext, svc)
		}
		r.endpointRules(b, s, svc)
	}
	for _, c := range stale {
		fmt.Fprintf(b, "-X %s\n", c)
	}
	fmt.Fprintf(b, "-A %s -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j %s\n", kubeServices, kubeNodePorts)
	b.WriteString("COMMIT\n")
}

// endpointRules writes the statistic ladder of svc and each endpoint's SEP
// chain.
func (r *renderer) endpointRules(b *bytes.Buffer, s *Service, svc string) {
	n := len(s.Endpoints)
	for k, ep := range s.Endpoints {
		b.WriteString("-A " + svc)
		if !r.large {
			fmt.Fprintf(b, " -m comment --comment \"%s -> %s\"", s.portName(), ep)
		}
		if k < n-1 {
			b.WriteString(" -m statistic --mode random --probability " + probability(n-k))
		}
		b.WriteString(" -j " + s.SEPChain(ep) + "\n")
	}
	p := s.protocol()
	for _, ep := range s.Endpoints {
		prefix := "-A " + s.SEPChain(ep)
		if !r.large {
			prefix += " -m comment --comment " + s.portName()
		}
		fmt.Fprintf(b, "%s -s %s -j %s\n", prefix, ep.Addr(), kubeMarkMasq)
		fmt.Fprintf(b, "%s -m %s -p %s -j DNAT --to-destination %s\n", prefix, p, p, ep)
	}
}
