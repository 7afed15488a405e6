package main

import (
	"fmt"
	"net/netip"

	"github.com/vipd/vipd/bench/kubeproxy"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// owner owns every service the benchmarks create.
const owner = "bench"

// fillerVIPs is how many VIP addresses fillers use before moving on to the
// next port; they stay below 198.19.254.0, which the tested services use.
const fillerVIPs = 65000

// filler returns the i-th of the services that are present but never
// tested: a distinct VIP:80 (then :81, ... past fillerVIPs services) with k
// backends on 198.18.128.0/17, which no pod has.
func filler(i, k int) *vipdv1.Service {
	v, port := i%fillerVIPs+1, uint32(80+i/fillerVIPs)
	svc := &vipdv1.Service{
		Name:  fmt.Sprintf("%s/f%06d", owner, i),
		Owner: owner,
		Vips:  []string{fmt.Sprintf("198.19.%d.%d", v>>8, v&255)},
	}
	j := i * k
	svc.Ports = []*vipdv1.Port{{Port: port, TargetPort: uint32(8080 + j/32768)}}
	for b := range k {
		a := (j + b) % 32768
		svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", 128+a>>8, a&255)})
	}
	return svc
}

// fillers returns fillers 0..n-1 with k backends each.
func fillers(n, k int) []*vipdv1.Service {
	svcs := make([]*vipdv1.Service, n)
	for i := range svcs {
		svcs[i] = filler(i, k)
	}
	return svcs
}

// kubeProxyFillers returns the same fillers as kube-proxy services.
func kubeProxyFillers(n, k int) []kubeproxy.Service {
	svcs := make([]kubeproxy.Service, n)
	for i := range svcs {
		f := filler(i, k)
		s := kubeproxy.Service{
			Namespace: owner, Name: fmt.Sprintf("f%06d", i), PortName: "http",
			VIP: netip.MustParseAddr(f.Vips[0]), Port: uint16(f.Ports[0].Port), Protocol: "tcp",
		}
		for _, b := range f.Backends {
			s.Endpoints = append(s.Endpoints, netip.AddrPortFrom(netip.MustParseAddr(b.Ip), uint16(f.Ports[0].TargetPort)))
		}
		svcs[i] = s
	}
	return svcs
}

// backendsOf lists addrs as API backends.
func backendsOf(addrs ...netip.Addr) []*vipdv1.Backend {
	bs := make([]*vipdv1.Backend, len(addrs))
	for i, a := range addrs {
		bs[i] = &vipdv1.Backend{Ip: a.String()}
	}
	return bs
}
