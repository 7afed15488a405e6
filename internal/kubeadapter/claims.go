package kubeadapter

// Claims: the address:port/protocol pairs of a service, as vipd's store
// keys them, which no two services may share: VIP:ports, external and
// load-balancer IP:ports, and node ports (on every node-port address, so
// keyed without one), with the health-check node port as a TCP one.

import (
	"fmt"
	"net/netip"
	"strings"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// claim is one address:port/protocol; a node port has no address.
type claim struct {
	vip   netip.Addr
	proto vipdv1.Protocol
	port  uint32
}

func (c claim) String() string {
	proto := strings.TrimPrefix(c.proto.String(), "PROTOCOL_")
	if !c.vip.IsValid() {
		return fmt.Sprintf("node port %d/%s", c.port, proto)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(c.vip, uint16(c.port)), proto)
}

func protocolOf(p *vipdv1.Port) vipdv1.Protocol {
	if p.Protocol == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
		return vipdv1.Protocol_PROTOCOL_TCP
	}
	return p.Protocol
}

// addrClaims are the claims of addrs on s's ports.
func addrClaims(s *vipdv1.Service, addrs ...[]string) []claim {
	var out []claim
	for _, list := range addrs {
		for _, v := range list {
			ip, err := netip.ParseAddr(v)
			if err != nil {
				continue
			}
			for _, p := range s.Ports {
				out = append(out, claim{ip.Unmap(), protocolOf(p), p.Port})
			}
		}
	}
	return out
}

// vipClaimsOf are s's VIP:ports.
func vipClaimsOf(s *vipdv1.Service) []claim { return addrClaims(s, s.Vips) }

// externalClaimsOf are the claims of s's external part: external and
// load-balancer IP:ports, node ports and the health-check node port.
func externalClaimsOf(s *vipdv1.Service) []claim {
	out := addrClaims(s, s.ExternalIps, s.LoadBalancerIps)
	for _, p := range s.Ports {
		if p.NodePort != 0 {
			out = append(out, claim{proto: protocolOf(p), port: p.NodePort})
		}
	}
	if s.HealthCheckNodePort != 0 {
		out = append(out, claim{proto: vipdv1.Protocol_PROTOCOL_TCP, port: s.HealthCheckNodePort})
	}
	return out
}

func claimsOf(s *vipdv1.Service) []claim {
	return append(vipClaimsOf(s), externalClaimsOf(s)...)
}

// freesClaims reports whether prev holds a claim that next does not.
func freesClaims(prev, next *vipdv1.Service) bool {
	if prev == nil {
		return false
	}
	kept := map[claim]bool{}
	for _, c := range claimsOf(next) {
		kept[c] = true
	}
	for _, c := range claimsOf(prev) {
		if !kept[c] {
			return true
		}
	}
	return false
}
