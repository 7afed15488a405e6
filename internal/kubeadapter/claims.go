package kubeadapter

// Claims: the VIP:port/protocol pairs of a service, as vipd's store keys
// them, which no two services may share.

import (
	"net/netip"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// claim is one VIP:port/protocol, as vipd's store keys them.
type claim struct {
	vip   netip.Addr
	proto vipdv1.Protocol
	port  uint32
}

func claimsOf(s *vipdv1.Service) []claim {
	var out []claim
	for _, v := range s.Vips {
		ip, err := netip.ParseAddr(v)
		if err != nil {
			continue
		}
		for _, p := range s.Ports {
			proto := p.Protocol
			if proto == vipdv1.Protocol_PROTOCOL_UNSPECIFIED {
				proto = vipdv1.Protocol_PROTOCOL_TCP
			}
			out = append(out, claim{ip.Unmap(), proto, p.Port})
		}
	}
	return out
}

// freesClaims reports whether prev holds a VIP:port that next does not.
func freesClaims(prev, next *vipdv1.Service) bool {
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
