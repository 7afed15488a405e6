package ebpf

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
)

// feKey names a frontend: one (VIP, port, protocol) of a service.
type feKey struct {
	addr  netip.Addr
	port  uint16
	proto uint8
}

func (k feKey) String() string {
	return netip.AddrPortFrom(k.addr, k.port).String() + "/" + protoName(k.proto)
}

// beKey names a backend as the maps know it: an address and a port.
type beKey struct {
	addr netip.Addr
	port uint16
}

func (k beKey) String() string { return netip.AddrPortFrom(k.addr, k.port).String() }

// frontend is the desired map content of one frontend, before IDs.
type frontend struct {
	key     feKey
	service string
	flags   uint32
	timeout uint32 // affinity timeout, seconds
	weight  uint32 // total weight, when weighted
	maglevM uint32 // Maglev table size, when Maglev
	// slots are the backends that may take new connections, in slot order,
	// each with its cumulative weight (exclusive end).
	slots []slot
	// members are every backend of the VIP's family the service lists,
	// mapped to their member flags.
	members map[beKey]uint32
}

type slot struct {
	backend beKey
	weight  uint16
	cum     uint32
}

// equal reports whether f and g program the same map entries.
func (f *frontend) equal(g *frontend) bool {
	if f.key != g.key || f.flags != g.flags || f.timeout != g.timeout || f.weight != g.weight ||
		f.maglevM != g.maglevM || len(f.members) != len(g.members) {
		return false
	}
	if !slices.Equal(f.slots, g.slots) {
		return false
	}
	for k, v := range f.members {
		if w, ok := g.members[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func protoNumber(p dataplane.Protocol) uint8 {
	switch p {
	case dataplane.TCP:
		return ipprotoTCP
	case dataplane.UDP:
		return ipprotoUDP
	case dataplane.SCTP:
		return ipprotoSCTP
	}
	return 0
}

func protoName(p uint8) string {
	switch p {
	case ipprotoTCP:
		return "TCP"
	case ipprotoUDP:
		return "UDP"
	case ipprotoSCTP:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// frontendsOf turns a service into its frontends, one per VIP and port. It
// fails, wrapping dataplane.ErrUnsupported, for an SCTP port whose target
// port differs: rewriting an SCTP port means recomputing the CRC32c of the
// whole packet, which this dataplane does not do.
func frontendsOf(svc *dataplane.Service, maglevMin uint32) ([]*frontend, error) {
	var out []*frontend
	for _, vip := range svc.VIPs {
		is6 := vip.Is6()
		eligible := svc.EligibleBackends(is6)
		for _, p := range svc.Ports {
			fe := &frontend{
				key:     feKey{addr: vip, port: p.Port, proto: protoNumber(p.Protocol)},
				service: svc.Name,
				members: map[beKey]uint32{},
			}
			for i := range svc.Backends {
				b := &svc.Backends[i]
				if b.IP.Is6() != is6 {
					continue
				}
				k := beKey{addr: b.IP, port: b.TargetPort(p)}
				if p.Protocol == dataplane.SCTP && k.port != p.Port {
					return nil, &dataplane.UnsupportedError{
						Service: svc.Name,
						Feature: fmt.Sprintf("SCTP port %d with target port %d (backend %s)", p.Port, k.port, b.IP),
						Hint:    "an SCTP port must equal its target port on the ebpf dataplane (a port rewrite needs the CRC32c of the whole packet recomputed); use the iptables dataplane",
					}
				}
				fe.members[k] = 0
			}
			uniform := true
			for _, b := range eligible {
				k := beKey{addr: b.IP, port: b.TargetPort(p)}
				fe.members[k] = memberFlagEligible
				w := max(b.Weight, 1)
				fe.weight += uint32(w)
				fe.slots = append(fe.slots, slot{backend: k, weight: w, cum: fe.weight})
				if w != fe.slots[0].weight {
					uniform = false
				}
			}
			if !uniform {
				fe.flags |= svcFlagWeighted
			}
			if svc.Affinity.ClientIP {
				fe.flags |= svcFlagAffinity
				fe.timeout = uint32(min(math.Ceil(svc.Affinity.Timeout.Seconds()), math.MaxUint32))
			}
			if svc.LoadBalancing == dataplane.LoadBalancingMaglev && len(fe.slots) > 0 {
				m, err := maglev.TableSize(maglevMin, len(fe.slots))
				if err != nil {
					return nil, fmt.Errorf("service %s: %w", svc.Name, err)
				}
				fe.flags |= svcFlagMaglev
				fe.maglevM = m
			}
			out = append(out, fe)
		}
	}
	return out, nil
}
