package validation_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// valid returns a small valid service; each table row changes it in one way.
func valid() *vipdv1.Service {
	return &vipdv1.Service{
		Name:     "default/web",
		Vips:     []string{"10.96.0.10"},
		Ports:    []*vipdv1.Port{{Name: "http", Port: 80}},
		Backends: []*vipdv1.Backend{{Ip: "10.0.0.1"}},
	}
}

// vips returns n distinct IPv4 VIPs in 10.96.0.0/24.
func vips(n int) []string {
	var res []string
	for i := range n {
		res = append(res, fmt.Sprintf("10.96.0.%d", i+1))
	}
	return res
}

// ports returns n distinct named TCP ports.
func ports(n int) []*vipdv1.Port {
	var res []*vipdv1.Port
	for i := range n {
		res = append(res, &vipdv1.Port{Name: fmt.Sprintf("p%d", i), Port: uint32(1000 + i)})
	}
	return res
}

// backends returns n distinct IPv4 backends in 10.0.0.0/16.
func backends(n int) []*vipdv1.Backend {
	var res []*vipdv1.Backend
	for i := range n {
		res = append(res, &vipdv1.Backend{Ip: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)})
	}
	return res
}

func labels(n int) map[string]string {
	res := map[string]string{}
	for i := range n {
		res[fmt.Sprintf("k%d", i)] = "v"
	}
	return res
}

// fields lists the field paths of v, sorted, keeping repeats.
func fields(v validation.Violations) []string {
	var res []string
	for _, x := range v {
		res = append(res, x.Field)
	}
	slices.Sort(res)
	return res
}

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

var serviceCIDRs = []netip.Prefix{
	netip.MustParsePrefix("10.96.0.0/12"),
	netip.MustParsePrefix("fd00:96::/108"),
}

func TestServiceViolations(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name   string
		limits validation.Limits
		edit   func(s *vipdv1.Service)
		// want lists the violated field paths, sorted; nil means valid.
		want []string
	}{
		{name: "minimal service is valid"},

		// name
		{name: "name missing", edit: func(s *vipdv1.Service) { s.Name = "" }, want: []string{"service.name"}},
		{name: "name of 253 characters", edit: func(s *vipdv1.Service) { s.Name = long(253) }},
		{name: "name of 254 characters", edit: func(s *vipdv1.Service) { s.Name = long(254) }, want: []string{"service.name"}},
		{name: "name with every allowed character", edit: func(s *vipdv1.Service) { s.Name = "a-b.c/d_e0123456789" }},
		{name: "name with upper case", edit: func(s *vipdv1.Service) { s.Name = "Web" }, want: []string{"service.name"}},
		{name: "name with a colon", edit: func(s *vipdv1.Service) { s.Name = "web:80" }, want: []string{"service.name"}},
		{name: "name with a space", edit: func(s *vipdv1.Service) { s.Name = "my web" }, want: []string{"service.name"}},
		{name: "name with non-ASCII", edit: func(s *vipdv1.Service) { s.Name = "wéb" }, want: []string{"service.name"}},

		// owner
		{name: "owner set", edit: func(s *vipdv1.Service) { s.Owner = "kube/cluster-1" }},
		{name: "owner with upper case", edit: func(s *vipdv1.Service) { s.Owner = "Kube" }, want: []string{"service.owner"}},
		{name: "owner of 254 characters", edit: func(s *vipdv1.Service) { s.Owner = long(254) }, want: []string{"service.owner"}},

		// vips
		{name: "no VIPs", edit: func(s *vipdv1.Service) { s.Vips = nil }, want: []string{"service.vips"}},
		{name: "8 VIPs", edit: func(s *vipdv1.Service) { s.Vips = vips(8) }},
		{name: "9 VIPs", edit: func(s *vipdv1.Service) { s.Vips = vips(9) }, want: []string{"service.vips"}},
		{name: "malformed VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0"} }, want: []string{"service.vips[0]"}},
		{name: "empty VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{""} }, want: []string{"service.vips[0]"}},
		{name: "VIP with leading zeros", edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.010"} }, want: []string{"service.vips[0]"}},
		{name: "VIP with a CIDR suffix", edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.10/32"} }, want: []string{"service.vips[0]"}},
		{name: "loopback IPv4 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"127.0.0.2"} }, want: []string{"service.vips[0]"}},
		{name: "loopback IPv6 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"::1"} }, want: []string{"service.vips[0]"}},
		{name: "multicast IPv4 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"224.0.0.1"} }, want: []string{"service.vips[0]"}},
		{name: "multicast IPv6 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"ff02::1"} }, want: []string{"service.vips[0]"}},
		{name: "unspecified IPv4 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"0.0.0.0"} }, want: []string{"service.vips[0]"}},
		{name: "unspecified IPv6 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"::"} }, want: []string{"service.vips[0]"}},
		{name: "link-local IPv4 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"169.254.0.10"} }, want: []string{"service.vips[0]"}},
		{name: "link-local IPv6 VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"fe80::10"} }, want: []string{"service.vips[0]"}},
		{name: "broadcast VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"255.255.255.255"} }, want: []string{"service.vips[0]"}},
		{name: "IPv4-mapped VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"::ffff:10.96.0.10"} }, want: []string{"service.vips[0]"}},
		{name: "VIP with a zone", edit: func(s *vipdv1.Service) { s.Vips = []string{"fd00::10%eth0"} }, want: []string{"service.vips[0]"}},
		{name: "duplicate VIP", edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.10", "10.96.0.11", "10.96.0.10"} }, want: []string{"service.vips[2]"}},
		{name: "duplicate VIP in another spelling", edit: func(s *vipdv1.Service) { s.Vips = []string{"fd00::10", "FD00:0::0010"}; s.Backends = nil }, want: []string{"service.vips[1]"}},
		{name: "every bad VIP is reported", edit: func(s *vipdv1.Service) { s.Vips = []string{"x", "10.96.0.10", "::1"} }, want: []string{"service.vips[0]", "service.vips[2]"}},
		{name: "first address of a service CIDR", limits: validation.Limits{ServiceCIDRs: serviceCIDRs}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.0"} }},
		{name: "last address of a service CIDR", limits: validation.Limits{ServiceCIDRs: serviceCIDRs}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.111.255.255"} }},
		{name: "just below a service CIDR", limits: validation.Limits{ServiceCIDRs: serviceCIDRs}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.95.255.255"} }, want: []string{"service.vips[0]"}},
		{name: "just above a service CIDR", limits: validation.Limits{ServiceCIDRs: serviceCIDRs}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.112.0.0"} }, want: []string{"service.vips[0]"}},
		{name: "IPv6 VIP inside the IPv6 service CIDR", limits: validation.Limits{ServiceCIDRs: serviceCIDRs}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.10", "fd00:96::f:ffff"} }},
		{name: "IPv6 VIP just outside the IPv6 service CIDR", limits: validation.Limits{ServiceCIDRs: serviceCIDRs}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.10", "fd00:96::10:0"} }, want: []string{"service.vips[1]"}},
		{name: "IPv6 VIP with only IPv4 service CIDRs", limits: validation.Limits{ServiceCIDRs: serviceCIDRs[:1]}, edit: func(s *vipdv1.Service) { s.Vips = []string{"10.96.0.10", "fd00:96::1"} }, want: []string{"service.vips[1]"}},
		{name: "any VIP without service CIDRs", edit: func(s *vipdv1.Service) { s.Vips = []string{"192.0.2.1"} }},

		// ports
		{name: "no ports", edit: func(s *vipdv1.Service) { s.Ports = nil }, want: []string{"service.ports"}},
		{name: "100 ports", limits: validation.Limits{MaxPorts: validation.DefaultMaxPorts}, edit: func(s *vipdv1.Service) { s.Ports = ports(100) }},
		{name: "101 ports", limits: validation.Limits{MaxPorts: validation.DefaultMaxPorts}, edit: func(s *vipdv1.Service) { s.Ports = ports(101) }, want: []string{"service.ports"}},
		{name: "max ports", limits: validation.Limits{MaxPorts: 3}, edit: func(s *vipdv1.Service) { s.Ports = ports(3) }},
		{name: "max ports + 1", limits: validation.Limits{MaxPorts: 3}, edit: func(s *vipdv1.Service) { s.Ports = ports(4) }, want: []string{"service.ports"}},
		{name: "max ports raised above the default", limits: validation.Limits{MaxPorts: 200}, edit: func(s *vipdv1.Service) { s.Ports = ports(200) }},
		{name: "raised max ports + 1", limits: validation.Limits{MaxPorts: 200}, edit: func(s *vipdv1.Service) { s.Ports = ports(201) }, want: []string{"service.ports"}},
		{name: "negative max ports is no limit", limits: validation.Limits{MaxPorts: -1}, edit: func(s *vipdv1.Service) { s.Ports = ports(1000) }},
		{name: "zero max ports is no limit", limits: validation.Limits{MaxPorts: 0}, edit: func(s *vipdv1.Service) { s.Ports = ports(1000) }},
		{name: "single unnamed port", edit: func(s *vipdv1.Service) { s.Ports[0].Name = "" }},
		{name: "unnamed ports when there are two", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Port: 80}, {Name: "https", Port: 443}, {Port: 8080}}
		}, want: []string{"service.ports[0].name", "service.ports[2].name"}},
		{name: "duplicate port name", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "http", Port: 80}, {Name: "http", Port: 8080}}
		}, want: []string{"service.ports[1].name"}},
		{name: "port name with upper case", edit: func(s *vipdv1.Service) { s.Ports[0].Name = "HTTP" }, want: []string{"service.ports[0].name"}},
		{name: "port name starting with a dash", edit: func(s *vipdv1.Service) { s.Ports[0].Name = "-http" }, want: []string{"service.ports[0].name"}},
		{name: "port name of 63 characters", edit: func(s *vipdv1.Service) { s.Ports[0].Name = long(63) }},
		{name: "port name of 64 characters", edit: func(s *vipdv1.Service) { s.Ports[0].Name = long(64) }, want: []string{"service.ports[0].name"}},
		{name: "UDP and SCTP", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53}, {Name: "sig", Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: 3868}}
		}},
		{name: "unknown protocol", edit: func(s *vipdv1.Service) { s.Ports[0].Protocol = 4 }, want: []string{"service.ports[0].protocol"}},
		{name: "negative protocol", edit: func(s *vipdv1.Service) { s.Ports[0].Protocol = -1 }, want: []string{"service.ports[0].protocol"}},
		{name: "port 0", edit: func(s *vipdv1.Service) { s.Ports[0].Port = 0 }, want: []string{"service.ports[0].port"}},
		{name: "port 1", edit: func(s *vipdv1.Service) { s.Ports[0].Port = 1 }},
		{name: "port 65535", edit: func(s *vipdv1.Service) { s.Ports[0].Port = 65535 }},
		{name: "port 65536", edit: func(s *vipdv1.Service) { s.Ports[0].Port = 65536 }, want: []string{"service.ports[0].port"}},
		{name: "target port 65535", edit: func(s *vipdv1.Service) { s.Ports[0].TargetPort = 65535 }},
		{name: "target port 65536", edit: func(s *vipdv1.Service) { s.Ports[0].TargetPort = 65536 }, want: []string{"service.ports[0].target_port"}},
		{name: "duplicate protocol and port", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "a", Port: 80}, {Name: "b", Port: 80, TargetPort: 8080}}
		}, want: []string{"service.ports[1]"}},
		{name: "duplicate port with TCP spelled and defaulted", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "a", Port: 80}, {Name: "b", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80}}
		}, want: []string{"service.ports[1]"}},
		{name: "same port with another protocol", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{
				{Name: "dns-tcp", Port: 53},
				{Name: "dns-udp", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53},
				{Name: "dns-sctp", Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: 53},
			}
		}},
		{name: "same target port twice", edit: func(s *vipdv1.Service) {
			s.Ports = []*vipdv1.Port{{Name: "a", Port: 80, TargetPort: 8080}, {Name: "b", Port: 81, TargetPort: 8080}}
		}},

		// backends
		{name: "no backends", edit: func(s *vipdv1.Service) { s.Backends = nil }},
		{name: "duplicate backend IP", edit: func(s *vipdv1.Service) { s.Backends = manyBackends(5, 1, 3) }, want: []string{"service.backends[3].ip"}},
		{name: "40 distinct backends", edit: func(s *vipdv1.Service) { s.Backends = manyBackends(40) }},
		{name: "duplicate backend IPs among many", edit: func(s *vipdv1.Service) { s.Backends = manyBackends(40, 2, 17, 30, 39) },
			want: []string{"service.backends[17].ip", "service.backends[30].ip", "service.backends[39].ip"}},
		{name: "malformed backend IP", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "10.0.0.300" }, want: []string{"service.backends[0].ip"}},
		{name: "missing backend IP", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "" }, want: []string{"service.backends[0].ip"}},
		{name: "loopback backend", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "127.0.0.1" }, want: []string{"service.backends[0].ip"}},
		{name: "multicast backend", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "239.1.1.1" }, want: []string{"service.backends[0].ip"}},
		{name: "unspecified backend", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "0.0.0.0" }, want: []string{"service.backends[0].ip"}},
		{name: "link-local backend", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "169.254.1.1" }, want: []string{"service.backends[0].ip"}},
		{name: "IPv4-mapped backend", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "::ffff:10.0.0.1" }, want: []string{"service.backends[0].ip"}},
		{name: "backend with a zone", edit: func(s *vipdv1.Service) { s.Backends[0].Ip = "fe80::1%eth0" }, want: []string{"service.backends[0].ip"}},
		{name: "IPv6 backend of an IPv4 service", edit: func(s *vipdv1.Service) {
			s.Backends = []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: "fd00::1"}}
		}, want: []string{"service.backends[1].ip"}},
		{name: "IPv4 backend of an IPv6 service", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"fd00:96::10"}
			s.Backends = []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: "fd00::1"}}
		}, want: []string{"service.backends[0].ip"}},
		{name: "a bad VIP does not make backends fail the family check", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"::1"}
			s.Backends = []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: "fd00::1"}}
		}, want: []string{"service.vips[0]"}},
		{name: "both families in a dual-stack service", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"10.96.0.10", "fd00:96::10"}
			s.Backends = []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: "fd00::1"}}
		}},
		{name: "duplicate backend IP", edit: func(s *vipdv1.Service) {
			s.Backends = []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: "10.0.0.2"}, {Ip: "10.0.0.1", Weight: 2}}
		}, want: []string{"service.backends[2].ip"}},
		{name: "duplicate backend IP in another spelling", edit: func(s *vipdv1.Service) {
			s.Vips = []string{"fd00:96::10"}
			s.Backends = []*vipdv1.Backend{{Ip: "fd00::a"}, {Ip: "FD00:0:0::000A"}}
		}, want: []string{"service.backends[1].ip"}},
		{name: "backend port override", edit: func(s *vipdv1.Service) { s.Backends[0].Ports = map[string]uint32{"http": 8080} }},
		{name: "backend port override of 65535", edit: func(s *vipdv1.Service) { s.Backends[0].Ports = map[string]uint32{"http": 65535} }},
		{name: "backend port override of an unknown port", edit: func(s *vipdv1.Service) {
			s.Backends[0].Ports = map[string]uint32{"http": 8080, "https": 8443}
		}, want: []string{`service.backends[0].ports["https"]`}},
		{name: "backend port override of the only, unnamed port", edit: func(s *vipdv1.Service) {
			s.Ports[0].Name = ""
			s.Backends[0].Ports = map[string]uint32{"": 8080}
		}},
		{name: "backend port override by the empty name of a named port", edit: func(s *vipdv1.Service) {
			s.Backends[0].Ports = map[string]uint32{"": 8080}
		}, want: []string{`service.backends[0].ports[""]`}},
		{name: "backend port override by the empty name with two ports", edit: func(s *vipdv1.Service) {
			s.Ports = ports(2)
			s.Backends[0].Ports = map[string]uint32{"": 8080, "p0": 8080}
		}, want: []string{`service.backends[0].ports[""]`}},
		{name: "backend port override by the empty name with two ports, one unnamed", edit: func(s *vipdv1.Service) {
			s.Ports = ports(2)
			s.Ports[1].Name = ""
			s.Backends[0].Ports = map[string]uint32{"": 8080}
		}, want: []string{`service.backends[0].ports[""]`, "service.ports[1].name"}},
		{name: "backend serving only named ports", edit: func(s *vipdv1.Service) {
			s.Ports = ports(2)
			s.Backends[0].Ports = map[string]uint32{"p1": 8080}
			s.Backends[0].OnlyNamedPorts = true
		}},
		{name: "backend serving only named ports, naming none", edit: func(s *vipdv1.Service) {
			s.Backends[0].OnlyNamedPorts = true
		}},
		{name: "backend serving only named ports, naming an unknown one", edit: func(s *vipdv1.Service) {
			s.Backends[0].Ports = map[string]uint32{"https": 8443}
			s.Backends[0].OnlyNamedPorts = true
		}, want: []string{`service.backends[0].ports["https"]`}},
		{name: "backend serving only the unnamed port", edit: func(s *vipdv1.Service) {
			s.Ports[0].Name = ""
			s.Backends[0].Ports = map[string]uint32{"": 8080}
			s.Backends[0].OnlyNamedPorts = true
		}},
		{name: "backend port override of 0", edit: func(s *vipdv1.Service) { s.Backends[0].Ports = map[string]uint32{"http": 0} }, want: []string{`service.backends[0].ports["http"]`}},
		{name: "backend port override of 65536", edit: func(s *vipdv1.Service) { s.Backends[0].Ports = map[string]uint32{"http": 65536} }, want: []string{`service.backends[0].ports["http"]`}},
		{name: "backend states", edit: func(s *vipdv1.Service) {
			s.Backends = backends(4)
			s.Backends[1].State = vipdv1.BackendState_BACKEND_STATE_READY
			s.Backends[2].State = vipdv1.BackendState_BACKEND_STATE_TERMINATING
			s.Backends[3].State = vipdv1.BackendState_BACKEND_STATE_NOT_SERVING
		}},
		{name: "unknown backend state", edit: func(s *vipdv1.Service) { s.Backends[0].State = 4 }, want: []string{"service.backends[0].state"}},
		{name: "weight 65535", edit: func(s *vipdv1.Service) { s.Backends[0].Weight = 65535 }},
		{name: "weight 65536", edit: func(s *vipdv1.Service) { s.Backends[0].Weight = 65536 }, want: []string{"service.backends[0].weight"}},
		{name: "zone of 63 characters", edit: func(s *vipdv1.Service) { s.Backends[0].Zone = long(63) }},
		{name: "zone of 64 characters", edit: func(s *vipdv1.Service) { s.Backends[0].Zone = long(64) }, want: []string{"service.backends[0].zone"}},
		{name: "zone with a control character", edit: func(s *vipdv1.Service) { s.Backends[0].Zone = "zone\x7f" }, want: []string{"service.backends[0].zone"}},

		// topology
		{name: "traffic distribution prefer same zone", edit: func(s *vipdv1.Service) {
			s.TrafficDistribution = vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE
		}},
		{name: "traffic distribution prefer same node", edit: func(s *vipdv1.Service) {
			s.TrafficDistribution = vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE
		}},
		{name: "unknown traffic distribution", edit: func(s *vipdv1.Service) { s.TrafficDistribution = 3 }, want: []string{"service.traffic_distribution"}},
		{name: "eight zone and node hints", edit: func(s *vipdv1.Service) {
			s.Backends[0].ForZones = []string{"a", "b", "c", "d", "e", "f", "g", long(63)}
			s.Backends[0].ForNodes = []string{"a", "b", "c", "d", "e", "f", "g", long(253)}
		}},
		{name: "nine zone hints", edit: func(s *vipdv1.Service) {
			s.Backends[0].ForZones = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
		}, want: []string{"service.backends[0].for_zones"}},
		{name: "nine node hints", edit: func(s *vipdv1.Service) {
			s.Backends[0].ForNodes = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
		}, want: []string{"service.backends[0].for_nodes"}},
		{name: "empty zone hint", edit: func(s *vipdv1.Service) { s.Backends[0].ForZones = []string{"a", ""} }, want: []string{"service.backends[0].for_zones[1]"}},
		{name: "empty node hint", edit: func(s *vipdv1.Service) { s.Backends[0].ForNodes = []string{""} }, want: []string{"service.backends[0].for_nodes[0]"}},
		{name: "zone hint of 64 characters", edit: func(s *vipdv1.Service) { s.Backends[0].ForZones = []string{long(64)} }, want: []string{"service.backends[0].for_zones[0]"}},
		{name: "node hint of 254 characters", edit: func(s *vipdv1.Service) { s.Backends[0].ForNodes = []string{long(254)} }, want: []string{"service.backends[0].for_nodes[0]"}},
		{name: "zone hint with a control character", edit: func(s *vipdv1.Service) { s.Backends[0].ForZones = []string{"a\n"} }, want: []string{"service.backends[0].for_zones[0]"}},
		{name: "repeated node hint", edit: func(s *vipdv1.Service) { s.Backends[0].ForNodes = []string{"n1", "n2", "n1"} }, want: []string{"service.backends[0].for_nodes[2]"}},
		{name: "every bad backend field is reported", edit: func(s *vipdv1.Service) {
			s.Backends[0] = &vipdv1.Backend{Ip: "fd00::1", Ports: map[string]uint32{"x": 1}, State: 9, Weight: 1 << 20, Zone: long(100)}
		}, want: []string{
			"service.backends[0].ip", `service.backends[0].ports["x"]`, "service.backends[0].state",
			"service.backends[0].weight", "service.backends[0].zone",
		}},
		{name: "max backends", limits: validation.Limits{MaxBackends: 3}, edit: func(s *vipdv1.Service) { s.Backends = backends(3) }},
		{name: "max backends + 1", limits: validation.Limits{MaxBackends: 3}, edit: func(s *vipdv1.Service) { s.Backends = backends(4) }, want: []string{"service.backends"}},
		{name: "default max backends", limits: validation.Limits{MaxBackends: validation.DefaultMaxBackends}, edit: func(s *vipdv1.Service) {
			s.Backends = backends(validation.DefaultMaxBackends)
		}},
		{name: "default max backends + 1", limits: validation.Limits{MaxBackends: validation.DefaultMaxBackends}, edit: func(s *vipdv1.Service) {
			s.Backends = backends(validation.DefaultMaxBackends + 1)
		}, want: []string{"service.backends"}},
		// The store reads its state file without limits (Limits{}), so zero must not mean "no backends".
		{name: "zero max backends is no limit", edit: func(s *vipdv1.Service) { s.Backends = backends(1000) }},

		// session affinity
		{name: "affinity NONE", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE}
		}},
		{name: "affinity NONE with a timeout", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE, TimeoutSeconds: 60}
		}, want: []string{"service.session_affinity.timeout_seconds"}},
		{name: "affinity unspecified with a timeout", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{TimeoutSeconds: 60}
		}, want: []string{"service.session_affinity.timeout_seconds"}},
		{name: "affinity CLIENT_IP with timeout 1", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 1}
		}},
		{name: "affinity CLIENT_IP with timeout 86400", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 86400}
		}},
		{name: "affinity CLIENT_IP with timeout 86401", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 86401}
		}, want: []string{"service.session_affinity.timeout_seconds"}},
		{name: "unknown affinity mode", edit: func(s *vipdv1.Service) {
			s.SessionAffinity = &vipdv1.SessionAffinityConfig{Mode: 3}
		}, want: []string{"service.session_affinity.mode"}},

		// traffic policy and load balancing
		{name: "traffic policy LOCAL", edit: func(s *vipdv1.Service) { s.InternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL }},
		{name: "unknown traffic policy", edit: func(s *vipdv1.Service) { s.InternalTrafficPolicy = 3 }, want: []string{"service.internal_traffic_policy"}},
		{name: "load balancing MAGLEV", edit: func(s *vipdv1.Service) { s.LoadBalancing = vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV }},
		{name: "unknown load balancing", edit: func(s *vipdv1.Service) { s.LoadBalancing = 3 }, want: []string{"service.load_balancing"}},

		// labels
		{name: "64 labels", edit: func(s *vipdv1.Service) { s.Labels = labels(64) }},
		{name: "65 labels", edit: func(s *vipdv1.Service) { s.Labels = labels(65) }, want: []string{"service.labels"}},
		{name: "empty label key", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"": "v"} }, want: []string{`service.labels[""]`}},
		{name: "label value with a control character", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"team": "a\tb"} }, want: []string{`service.labels["team"]`}},
		{name: "label key with a control character", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"te\x00am": "a"} }, want: []string{`service.labels["te\x00am"]`}},
		{name: "label of printable unicode", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"équipe": "réseau ünd mehr"} }},
		{name: "label key of 253 characters", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{long(253): "v"} }},
		{name: "label key of 254 characters", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{long(254): "v"} }, want: []string{fmt.Sprintf("service.labels[%q]", long(254))}},
		{name: "label value of 253 characters", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"k": long(253)} }},
		{name: "label value of 254 characters", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"k": long(254)} }, want: []string{`service.labels["k"]`}},
		{name: "empty label value", edit: func(s *vipdv1.Service) { s.Labels = map[string]string{"k": ""} }},

		// generation is output only
		{name: "generation is ignored", edit: func(s *vipdv1.Service) { s.Generation = 42 }},

		{name: "every violation is reported", limits: validation.Limits{MaxBackends: 1}, edit: func(s *vipdv1.Service) {
			*s = vipdv1.Service{
				Name:                  "Web",
				Owner:                 "?",
				Vips:                  []string{"10.96.0.10", "::1"},
				Ports:                 []*vipdv1.Port{{Name: "a", Port: 0}, {Port: 80}},
				Backends:              []*vipdv1.Backend{{Ip: "10.0.0.1"}, {Ip: "10.0.0.2", Weight: 70000}},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: 9},
				InternalTrafficPolicy: 9,
				LoadBalancing:         9,
				Labels:                map[string]string{"": ""},
			}
		}, want: []string{
			"service.backends", "service.backends[1].weight", "service.internal_traffic_policy",
			`service.labels[""]`, "service.load_balancing", "service.name", "service.owner",
			"service.ports[0].port", "service.ports[1].name", "service.session_affinity.mode", "service.vips[1]",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := valid()
			if tt.edit != nil {
				tt.edit(in)
			}
			before := proto.Clone(in)
			out, dp, v := validation.Service(in, tt.limits, "service")
			if diff := cmp.Diff(tt.want, fields(v)); diff != "" {
				t.Errorf("violated fields (-want +got):\n%s\nviolations: %v", diff, v)
			}
			for _, x := range v {
				if x.Description == "" {
					t.Errorf("violation of %s has no description", x.Field)
				}
			}
			if len(v) > 0 && (out != nil || dp != nil) {
				t.Errorf("Service returned a result along with violations: %v, %v", out, dp)
			}
			if len(v) == 0 && (out == nil || dp == nil) {
				t.Errorf("Service returned no result for a valid service")
			}
			if !proto.Equal(in, before) {
				t.Errorf("Service modified its input:\n%s", cmp.Diff(before, in, protocmp.Transform()))
			}
		})
	}
}

func TestServiceNil(t *testing.T) {
	out, dp, v := validation.Service(nil, validation.Limits{}, "services[2]")
	if diff := cmp.Diff([]string{"services[2]"}, fields(v)); diff != "" || out != nil || dp != nil {
		t.Errorf("Service(nil) = %v, %v, %v", out, dp, v)
	}
}

func TestServiceFieldPrefix(t *testing.T) {
	in := valid()
	in.Vips = []string{"::1"}
	in.Backends[0].Weight = 1 << 17
	_, _, v := validation.Service(in, validation.Limits{}, "services[3]")
	want := []string{"services[3].backends[0].weight", "services[3].vips[0]"}
	if diff := cmp.Diff(want, fields(v)); diff != "" {
		t.Errorf("violated fields (-want +got):\n%s", diff)
	}
}

func TestServiceNormalized(t *testing.T) {
	tests := []struct {
		name   string
		limits validation.Limits
		in     *vipdv1.Service
		want   *vipdv1.Service
		wantDP *dataplane.Service
	}{
		{
			name: "defaults filled",
			in: &vipdv1.Service{
				Name:       "default/web",
				Vips:       []string{"10.96.0.10"},
				Ports:      []*vipdv1.Port{{Port: 80}},
				Backends:   []*vipdv1.Backend{{Ip: "10.0.0.1"}},
				Generation: 7,
			},
			want: &vipdv1.Service{
				Name:                  "default/web",
				Owner:                 "default",
				Vips:                  []string{"10.96.0.10"},
				Ports:                 []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 80}},
				Backends:              []*vipdv1.Backend{{Ip: "10.0.0.1", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1}},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			},
			wantDP: &dataplane.Service{
				Name:                  "default/web",
				Owner:                 "default",
				VIPs:                  []netip.Addr{addr("10.96.0.10")},
				Ports:                 []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 80}},
				Backends:              []dataplane.Backend{{IP: addr("10.0.0.1"), State: dataplane.BackendReady, Weight: 1}},
				TrafficPolicy:         dataplane.TrafficPolicyCluster,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingRandom,
			},
		},
		{
			name: "client IP affinity gets the default timeout",
			in: &vipdv1.Service{
				Name:            "web",
				Vips:            []string{"10.96.0.10"},
				Ports:           []*vipdv1.Port{{Port: 80}},
				SessionAffinity: &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP},
			},
			want: &vipdv1.Service{
				Name:                  "web",
				Owner:                 "default",
				Vips:                  []string{"10.96.0.10"},
				Ports:                 []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 80}},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 10800},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			},
			wantDP: &dataplane.Service{
				Name:                  "web",
				Owner:                 "default",
				VIPs:                  []netip.Addr{addr("10.96.0.10")},
				Ports:                 []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 80}},
				Affinity:              dataplane.SessionAffinity{ClientIP: true, Timeout: 3 * time.Hour},
				TrafficPolicy:         dataplane.TrafficPolicyCluster,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingRandom,
			},
		},
		{
			name: "everything set explicitly",
			in: &vipdv1.Service{
				Name:  "kube-system/dns",
				Owner: "kube",
				Vips:  []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{
					{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: 5353},
					{Name: "dns-tcp", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 53, TargetPort: 5353},
					{Name: "diameter", Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: 3868},
				},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.3", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, Weight: 65535, Zone: "b"},
					{Ip: "10.0.0.2", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING, Weight: 10, NodeLocal: true, Zone: "a"},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 60},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV,
				Labels:                map[string]string{"app": "dns"},
			},
			want: &vipdv1.Service{
				Name:  "kube-system/dns",
				Owner: "kube",
				Vips:  []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{
					{Name: "dns", Protocol: vipdv1.Protocol_PROTOCOL_UDP, Port: 53, TargetPort: 5353},
					{Name: "dns-tcp", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 53, TargetPort: 5353},
					{Name: "diameter", Protocol: vipdv1.Protocol_PROTOCOL_SCTP, Port: 3868, TargetPort: 3868},
				},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.2", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING, Weight: 10, NodeLocal: true, Zone: "a"},
					{Ip: "10.0.0.3", State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING, Weight: 65535, Zone: "b"},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_CLIENT_IP, TimeoutSeconds: 60},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_MAGLEV,
				Labels:                map[string]string{"app": "dns"},
			},
			wantDP: &dataplane.Service{
				Name:  "kube-system/dns",
				Owner: "kube",
				VIPs:  []netip.Addr{addr("10.96.0.10")},
				Ports: []dataplane.Port{
					{Name: "dns", Protocol: dataplane.UDP, Port: 53, TargetPort: 5353},
					{Name: "dns-tcp", Protocol: dataplane.TCP, Port: 53, TargetPort: 5353},
					{Name: "diameter", Protocol: dataplane.SCTP, Port: 3868, TargetPort: 3868},
				},
				Backends: []dataplane.Backend{
					{IP: addr("10.0.0.2"), State: dataplane.BackendTerminating, Weight: 10, NodeLocal: true, Zone: "a"},
					{IP: addr("10.0.0.3"), State: dataplane.BackendNotServing, Weight: 65535, Zone: "b"},
				},
				Affinity:              dataplane.SessionAffinity{ClientIP: true, Timeout: time.Minute},
				TrafficPolicy:         dataplane.TrafficPolicyLocal,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingMaglev,
			},
		},
		{
			name: "IPv6 addresses are canonical",
			in: &vipdv1.Service{
				Name:     "v6",
				Vips:     []string{"FD00:198::0001"},
				Ports:    []*vipdv1.Port{{Port: 443}},
				Backends: []*vipdv1.Backend{{Ip: "FD00:10:0:0::000A"}, {Ip: "fd00:10::9"}},
			},
			want: &vipdv1.Service{
				Name:                  "v6",
				Owner:                 "default",
				Vips:                  []string{"fd00:198::1"},
				Ports:                 []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 443, TargetPort: 443}},
				Backends:              []*vipdv1.Backend{{Ip: "fd00:10::9", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1}, {Ip: "fd00:10::a", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1}},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			},
			wantDP: &dataplane.Service{
				Name:                  "v6",
				Owner:                 "default",
				VIPs:                  []netip.Addr{addr("fd00:198::1")},
				Ports:                 []dataplane.Port{{Protocol: dataplane.TCP, Port: 443, TargetPort: 443}},
				Backends:              []dataplane.Backend{{IP: addr("fd00:10::9"), State: dataplane.BackendReady, Weight: 1}, {IP: addr("fd00:10::a"), State: dataplane.BackendReady, Weight: 1}},
				TrafficPolicy:         dataplane.TrafficPolicyCluster,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingRandom,
			},
		},
		{
			name: "Kubernetes endpoints: the unnamed port by the empty name, and a backend serving no port",
			in: &vipdv1.Service{
				Name:  "default/web",
				Vips:  []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.2", OnlyNamedPorts: true},
					{Ip: "10.0.0.1", Ports: map[string]uint32{"": 9090}, OnlyNamedPorts: true},
				},
			},
			want: &vipdv1.Service{
				Name:  "default/web",
				Owner: "default",
				Vips:  []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080}},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.1", Ports: map[string]uint32{"": 9090}, OnlyNamedPorts: true, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "10.0.0.2", OnlyNamedPorts: true, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			},
			wantDP: &dataplane.Service{
				Name:  "default/web",
				Owner: "default",
				VIPs:  []netip.Addr{addr("10.96.0.10")},
				Ports: []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
				Backends: []dataplane.Backend{
					{IP: addr("10.0.0.1"), Ports: map[string]uint16{"": 9090}, OnlyNamedPorts: true, State: dataplane.BackendReady, Weight: 1},
					{IP: addr("10.0.0.2"), OnlyNamedPorts: true, State: dataplane.BackendReady, Weight: 1},
				},
				TrafficPolicy:         dataplane.TrafficPolicyCluster,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingRandom,
			},
		},
		{
			name:   "dual stack, backends sorted by address not by string",
			limits: validation.Limits{MaxBackends: 5, ServiceCIDRs: serviceCIDRs},
			in: &vipdv1.Service{
				Name:  "dual",
				Vips:  []string{"fd00:96::1", "10.96.0.1"},
				Ports: []*vipdv1.Port{{Port: 80}},
				Backends: []*vipdv1.Backend{
					{Ip: "fd00::2"}, {Ip: "10.0.0.100"}, {Ip: "fd00::10"}, {Ip: "10.0.0.9"}, {Ip: "10.0.0.10"},
				},
			},
			want: &vipdv1.Service{
				Name:  "dual",
				Owner: "default",
				// VIPs keep their order: the first one is the primary family.
				Vips:  []string{"fd00:96::1", "10.96.0.1"},
				Ports: []*vipdv1.Port{{Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 80}},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.9", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "10.0.0.10", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "10.0.0.100", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "fd00::2", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "fd00::10", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			},
			wantDP: &dataplane.Service{
				Name:  "dual",
				Owner: "default",
				VIPs:  []netip.Addr{addr("fd00:96::1"), addr("10.96.0.1")},
				Ports: []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 80}},
				Backends: []dataplane.Backend{
					{IP: addr("10.0.0.9"), State: dataplane.BackendReady, Weight: 1},
					{IP: addr("10.0.0.10"), State: dataplane.BackendReady, Weight: 1},
					{IP: addr("10.0.0.100"), State: dataplane.BackendReady, Weight: 1},
					{IP: addr("fd00::2"), State: dataplane.BackendReady, Weight: 1},
					{IP: addr("fd00::10"), State: dataplane.BackendReady, Weight: 1},
				},
				TrafficPolicy:         dataplane.TrafficPolicyCluster,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingRandom,
			},
		},
		{
			name: "per-backend port overrides",
			in: &vipdv1.Service{
				Name:  "web",
				Vips:  []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{{Name: "http", Port: 80, TargetPort: 8080}, {Name: "https", Port: 443}},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.2", Ports: map[string]uint32{"http": 9080, "https": 9443}},
					{Ip: "10.0.0.1", Ports: map[string]uint32{"https": 8443}},
					{Ip: "10.0.0.3"},
				},
			},
			want: &vipdv1.Service{
				Name:  "web",
				Owner: "default",
				Vips:  []string{"10.96.0.10"},
				Ports: []*vipdv1.Port{
					{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080},
					{Name: "https", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 443, TargetPort: 443},
				},
				Backends: []*vipdv1.Backend{
					{Ip: "10.0.0.1", Ports: map[string]uint32{"https": 8443}, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "10.0.0.2", Ports: map[string]uint32{"http": 9080, "https": 9443}, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
					{Ip: "10.0.0.3", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
				},
				SessionAffinity:       &vipdv1.SessionAffinityConfig{Mode: vipdv1.SessionAffinity_SESSION_AFFINITY_NONE},
				InternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				ExternalTrafficPolicy: vipdv1.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
				LoadBalancing:         vipdv1.LoadBalancing_LOAD_BALANCING_RANDOM,
			},
			wantDP: &dataplane.Service{
				Name:  "web",
				Owner: "default",
				VIPs:  []netip.Addr{addr("10.96.0.10")},
				Ports: []dataplane.Port{
					{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080},
					{Name: "https", Protocol: dataplane.TCP, Port: 443, TargetPort: 443},
				},
				Backends: []dataplane.Backend{
					{IP: addr("10.0.0.1"), Ports: map[string]uint16{"https": 8443}, State: dataplane.BackendReady, Weight: 1},
					{IP: addr("10.0.0.2"), Ports: map[string]uint16{"http": 9080, "https": 9443}, State: dataplane.BackendReady, Weight: 1},
					{IP: addr("10.0.0.3"), State: dataplane.BackendReady, Weight: 1},
				},
				TrafficPolicy:         dataplane.TrafficPolicyCluster,
				ExternalTrafficPolicy: dataplane.TrafficPolicyCluster,
				LoadBalancing:         dataplane.LoadBalancingRandom,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := proto.Clone(tt.in)
			out, dp, v := validation.Service(tt.in, tt.limits, "service")
			if len(v) > 0 {
				t.Fatalf("Service: %v", v)
			}
			if diff := cmp.Diff(tt.want, out, protocmp.Transform()); diff != "" {
				t.Errorf("normalized service (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantDP, dp, addrCmp); diff != "" {
				t.Errorf("dataplane service (-want +got):\n%s", diff)
			}
			if !proto.Equal(tt.in, before) {
				t.Errorf("Service modified its input:\n%s", cmp.Diff(before, tt.in, protocmp.Transform()))
			}

			// Normalizing is idempotent: the store re-validates what it loads.
			out2, dp2, v := validation.Service(out, tt.limits, "service")
			if len(v) > 0 {
				t.Fatalf("Service of its own output: %v", v)
			}
			if diff := cmp.Diff(out, out2, protocmp.Transform()); diff != "" {
				t.Errorf("second normalization changed the service (-first +second):\n%s", diff)
			}
			if diff := cmp.Diff(dp, dp2, addrCmp); diff != "" {
				t.Errorf("second normalization changed the dataplane service (-first +second):\n%s", diff)
			}

			// The output shares nothing with the input.
			scribble(out)
			if !proto.Equal(tt.in, before) {
				t.Errorf("changing the output changed the input:\n%s", cmp.Diff(before, tt.in, protocmp.Transform()))
			}
		})
	}
}

// scribble overwrites every field of svc that could be shared with another message.
func scribble(svc *vipdv1.Service) {
	for i := range svc.Vips {
		svc.Vips[i] = "scribbled"
	}
	for _, p := range svc.Ports {
		p.Name, p.Port = "scribbled", 1
	}
	for _, b := range svc.Backends {
		b.Ip, b.Weight = "scribbled", 2
		for k := range b.Ports {
			b.Ports[k] = 3
		}
		if b.Ports == nil {
			b.Ports = map[string]uint32{}
		}
		b.Ports["scribbled"] = 4
	}
	if svc.SessionAffinity != nil {
		svc.SessionAffinity.TimeoutSeconds = 5
	}
	if svc.Labels == nil {
		svc.Labels = map[string]string{}
	}
	svc.Labels["scribbled"] = "x"
}

func TestServiceLimitsAtScale(t *testing.T) {
	in := valid()
	in.Vips = vips(validation.MaxVIPs)
	in.Ports = ports(validation.DefaultMaxPorts)
	out, dp, v := validation.Service(in, validation.Limits{}, "service")
	if len(v) > 0 {
		t.Fatalf("Service: %v", v)
	}
	if len(out.Vips) != 8 || len(dp.VIPs) != 8 {
		t.Errorf("got %d and %d VIPs, want 8", len(out.Vips), len(dp.VIPs))
	}
	if len(out.Ports) != 100 || len(dp.Ports) != 100 {
		t.Errorf("got %d and %d ports, want 100", len(out.Ports), len(dp.Ports))
	}
}

func TestBackend(t *testing.T) {
	v4 := &dataplane.Service{
		VIPs:  []netip.Addr{addr("10.96.0.10")},
		Ports: []dataplane.Port{{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
	}
	dual := &dataplane.Service{
		VIPs:  []netip.Addr{addr("10.96.0.10"), addr("fd00:96::10")},
		Ports: []dataplane.Port{{Name: "http", Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
	}
	v6 := &dataplane.Service{VIPs: []netip.Addr{addr("fd00:96::10")}}
	unnamed := &dataplane.Service{
		VIPs:  []netip.Addr{addr("10.96.0.10")},
		Ports: []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080}},
	}
	tests := []struct {
		name  string
		svc   *dataplane.Service
		in    *vipdv1.Backend
		want  []string
		wantB *vipdv1.Backend
		wantD dataplane.Backend
	}{
		{
			name:  "defaults filled in place",
			svc:   v4,
			in:    &vipdv1.Backend{Ip: "10.0.0.1"},
			wantB: &vipdv1.Backend{Ip: "10.0.0.1", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
			wantD: dataplane.Backend{IP: addr("10.0.0.1"), State: dataplane.BackendReady, Weight: 1},
		},
		{
			name:  "IPv6 made canonical",
			svc:   dual,
			in:    &vipdv1.Backend{Ip: "FD00::000B", Weight: 3, NodeLocal: true, Zone: "z"},
			wantB: &vipdv1.Backend{Ip: "fd00::b", State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 3, NodeLocal: true, Zone: "z"},
			wantD: dataplane.Backend{IP: addr("fd00::b"), State: dataplane.BackendReady, Weight: 3, NodeLocal: true, Zone: "z"},
		},
		{
			name:  "port override",
			svc:   dual,
			in:    &vipdv1.Backend{Ip: "10.0.0.1", Ports: map[string]uint32{"http": 9090}, State: vipdv1.BackendState_BACKEND_STATE_TERMINATING},
			wantB: &vipdv1.Backend{Ip: "10.0.0.1", Ports: map[string]uint32{"http": 9090}, State: vipdv1.BackendState_BACKEND_STATE_TERMINATING, Weight: 1},
			wantD: dataplane.Backend{IP: addr("10.0.0.1"), Ports: map[string]uint16{"http": 9090}, State: dataplane.BackendTerminating, Weight: 1},
		},
		{
			name:  "only named ports, and none named",
			svc:   v4,
			in:    &vipdv1.Backend{Ip: "10.0.0.1", OnlyNamedPorts: true},
			wantB: &vipdv1.Backend{Ip: "10.0.0.1", OnlyNamedPorts: true, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
			wantD: dataplane.Backend{IP: addr("10.0.0.1"), OnlyNamedPorts: true, State: dataplane.BackendReady, Weight: 1},
		},
		{
			name:  "the empty name for the only, unnamed port",
			svc:   unnamed,
			in:    &vipdv1.Backend{Ip: "10.0.0.1", Ports: map[string]uint32{"": 9090}, OnlyNamedPorts: true},
			wantB: &vipdv1.Backend{Ip: "10.0.0.1", Ports: map[string]uint32{"": 9090}, OnlyNamedPorts: true, State: vipdv1.BackendState_BACKEND_STATE_READY, Weight: 1},
			wantD: dataplane.Backend{IP: addr("10.0.0.1"), Ports: map[string]uint16{"": 9090}, OnlyNamedPorts: true, State: dataplane.BackendReady, Weight: 1},
		},
		{name: "the empty name for a named port", svc: v4, in: &vipdv1.Backend{Ip: "10.0.0.1", Ports: map[string]uint32{"": 80}}, want: []string{`upsert[0].ports[""]`}},
		{name: "the empty name for a service without ports", svc: v6, in: &vipdv1.Backend{Ip: "fd00::1", Ports: map[string]uint32{"": 80}}, want: []string{`upsert[0].ports[""]`}},
		{name: "nil backend", svc: v4, want: []string{"upsert[0]"}},
		{name: "IPv6 backend of an IPv4 service", svc: v4, in: &vipdv1.Backend{Ip: "fd00::1"}, want: []string{"upsert[0].ip"}},
		{name: "IPv4 backend of an IPv6 service", svc: v6, in: &vipdv1.Backend{Ip: "10.0.0.1"}, want: []string{"upsert[0].ip"}},
		{name: "override of a port the service lacks", svc: v6, in: &vipdv1.Backend{Ip: "fd00::1", Ports: map[string]uint32{"http": 80}}, want: []string{`upsert[0].ports["http"]`}},
		{name: "loopback", svc: dual, in: &vipdv1.Backend{Ip: "::1"}, want: []string{"upsert[0].ip"}},
		{name: "weight too high", svc: v4, in: &vipdv1.Backend{Ip: "10.0.0.1", Weight: 65536}, want: []string{"upsert[0].weight"}},
		{name: "unknown state", svc: v4, in: &vipdv1.Backend{Ip: "10.0.0.1", State: -1}, want: []string{"upsert[0].state"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, v := validation.Backend(tt.in, validation.NewBackendContext(tt.svc), "upsert[0]")
			if diff := cmp.Diff(tt.want, fields(v)); diff != "" {
				t.Errorf("violated fields (-want +got):\n%s\nviolations: %v", diff, v)
			}
			if len(v) > 0 {
				if diff := cmp.Diff(dataplane.Backend{}, db, addrCmp); diff != "" {
					t.Errorf("invalid backend returned a value:\n%s", diff)
				}
				return
			}
			if diff := cmp.Diff(tt.wantB, tt.in, protocmp.Transform()); diff != "" {
				t.Errorf("normalized backend (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantD, db, addrCmp); diff != "" {
				t.Errorf("dataplane backend (-want +got):\n%s", diff)
			}
		})
	}
}

func TestName(t *testing.T) {
	tests := []struct {
		name  string
		valid bool
	}{
		{"web", true},
		{"default/web-1.v2_x", true},
		{"0", true},
		{strings.Repeat("a", 253), true},
		{"", false},
		{strings.Repeat("a", 254), false},
		{"Web", false},
		{"web svc", false},
		{"web\n", false},
		{"web:80", false},
		{"wéb", false},
	}
	for _, tt := range tests {
		v := validation.Name(tt.name, "owner")
		if tt.valid && len(v) > 0 {
			t.Errorf("Name(%q) = %v, want valid", tt.name, v)
		}
		if !tt.valid && !slices.Equal(fields(v), []string{"owner"}) {
			t.Errorf("Name(%q) = %v, want one violation of owner", tt.name, v)
		}
	}
}

func TestViolationsError(t *testing.T) {
	v := validation.Violations{{Field: "a", Description: "is bad"}, {Field: "b[0]", Description: "is worse"}}
	if got, want := v.Error(), "a: is bad; b[0]: is worse"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestViolationsStableOrder(t *testing.T) {
	// Violations go back to the user and into logs; the same input must give
	// the same list, map iteration order notwithstanding.
	in := valid()
	in.Ports = []*vipdv1.Port{{Name: "a", Port: 80}, {Name: "b", Port: 81}}
	in.Backends[0].Ports = map[string]uint32{"x": 1, "y": 1, "z": 1, "a": 0, "b": 70000}
	in.Labels = map[string]string{"": "", strings.Repeat("k", 300): "", "v": strings.Repeat("v", 300), "w": strings.Repeat("w", 300)}
	_, _, first := validation.Service(in, validation.Limits{}, "service")
	if len(first) != 9 {
		t.Fatalf("got %d violations, want 9: %v", len(first), first)
	}
	for range 50 {
		_, _, v := validation.Service(in, validation.Limits{}, "service")
		if diff := cmp.Diff(first, v); diff != "" {
			t.Fatalf("violations differ between two calls (-first +now):\n%s", diff)
		}
	}
}

// manyBackends returns n backends 10.1.0.1, 10.1.0.2, ..., except that the
// backend at each index in dupOf (after the first, which names the
// original) repeats the address of backends[dupOf[0]].
func manyBackends(n int, dupOf ...int) []*vipdv1.Backend {
	var bs []*vipdv1.Backend
	for i := range n {
		bs = append(bs, &vipdv1.Backend{Ip: fmt.Sprintf("10.1.0.%d", i+1)})
	}
	if len(dupOf) > 0 {
		for _, i := range dupOf[1:] {
			bs[i].Ip = bs[dupOf[0]].Ip
		}
	}
	return bs
}
