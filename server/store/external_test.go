package store_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
)

// ext returns a one-port (TCP port) service on vip with the external
// addresses ext and load-balancer addresses lb (comma-separated, "" for
// none) and backends.
func ext(name, vip string, port uint32, extIPs, lbIPs string, backends ...string) *vipdv1.Service {
	s := with(name, vip, backends...)
	s.Ports[0] = tcp(port)
	if extIPs != "" {
		s.ExternalIps = strings.Split(extIPs, ",")
	}
	if lbIPs != "" {
		s.LoadBalancerIps = strings.Split(lbIPs, ",")
	}
	return s
}

// nodePorts returns a service on vip whose ports have the node ports of
// ports (TCP unless udp), and with health-check node port hc (LOCAL)
// unless 0.
func nodePorts(name, vip string, hc uint32, ports ...*vipdv1.Port) *vipdv1.Service {
	s := &vipdv1.Service{Name: name, Vips: []string{vip}, Ports: ports}
	if hc != 0 {
		s.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		s.HealthCheckNodePort = hc
	}
	return s
}

func np(p *vipdv1.Port, nodePort uint32) *vipdv1.Port {
	p.NodePort = nodePort
	return p
}

// TestNodePortClaims: a node port and protocol, and a health-check node
// port (a TCP node port), are held by one service at a time, as a
// VIP:port is; the error names both services and their fields.
func TestNodePortClaims(t *testing.T) {
	base := snapshot(t,
		nodePorts("web", "198.19.0.1", 0, np(tcp(80), 30080), np(udp(53), 30053)),
		nodePorts("lb", "198.19.0.2", 32000, np(tcp(443), 30443)),
	)
	tests := []struct {
		name string
		in   *vipdv1.Service
		// want is the conflict's claim, holder and message; "" holder: no
		// conflict.
		claim  store.Claim
		holder string
		msg    string
	}{
		{name: "same node port and protocol", in: nodePorts("x", "198.19.0.9", 0, np(tcp(8080), 30080)),
			claim: store.Claim{Protocol: dataplane.TCP, Port: 30080, Kind: store.ClaimNodePort}, holder: "web",
			msg: "service x: node port 30080/TCP (its ports[0].node_port) is already used by service web (its ports[0].node_port)"},
		{name: "same node port on UDP", in: nodePorts("x", "198.19.0.9", 0, np(tcp(8080), 30080), np(udp(53), 30053)),
			claim: store.Claim{Protocol: dataplane.TCP, Port: 30080, Kind: store.ClaimNodePort}, holder: "web"},
		{name: "a UDP node port that is another's TCP one", in: nodePorts("x", "198.19.0.9", 0, np(udp(53), 30080))},
		{name: "a node port that is another's health-check node port", in: nodePorts("x", "198.19.0.9", 0, np(tcp(80), 32000)),
			claim: store.Claim{Protocol: dataplane.TCP, Port: 32000, Kind: store.ClaimNodePort}, holder: "lb",
			msg: "service x: node port 32000/TCP (its ports[0].node_port) is already used by service lb (its health_check_node_port)"},
		{name: "a UDP node port that is another's health-check node port", in: nodePorts("x", "198.19.0.9", 0, np(udp(80), 32000))},
		{name: "a health-check node port that is another's node port", in: nodePorts("x", "198.19.0.9", 30443, tcp(80)),
			claim: store.Claim{Protocol: dataplane.TCP, Port: 30443, Kind: store.ClaimNodePort}, holder: "lb",
			msg: "service x: node port 30443/TCP (its health_check_node_port) is already used by service lb (its ports[0].node_port)"},
		{name: "the same health-check node port", in: nodePorts("x", "198.19.0.9", 32000, tcp(80)),
			claim: store.Claim{Protocol: dataplane.TCP, Port: 32000, Kind: store.ClaimNodePort}, holder: "lb"},
		{name: "a health-check node port that is another's UDP node port", in: nodePorts("x", "198.19.0.9", 30053, tcp(80))},
		{name: "a node port that is another's service port", in: nodePorts("x", "198.19.0.9", 0, np(tcp(80), 443))},
		{name: "a service keeps its own node ports", in: nodePorts("web", "198.19.0.1", 0, np(tcp(81), 30080), np(udp(53), 30053))},
		{name: "a service may move its health-check node port to a node port", in: nodePorts("lb", "198.19.0.2", 32001, np(tcp(443), 32000))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx := base.Begin()
			_, err := tx.Put(normalize(t, tt.in))
			if tt.holder == "" {
				if err != nil {
					t.Fatalf("Put: %v", err)
				}
				return
			}
			ce := conflict(t, err)
			if ce.Claim != tt.claim || ce.Holder != tt.holder || ce.Service != tt.in.Name {
				t.Errorf("conflict %+v; want claim %v held by %s", ce, tt.claim, tt.holder)
			}
			if tt.msg != "" && ce.Error() != tt.msg {
				t.Errorf("message %q\n want %q", ce.Error(), tt.msg)
			}
			if tx.Dirty() {
				t.Errorf("a refused Put staged a change: %v", tx.Changed())
			}
		})
	}

	// Deleting a service frees its node ports, its health-check one too.
	tx := base.Begin()
	tx.Delete("lb")
	put(t, tx, nodePorts("x", "198.19.0.9", 0, np(tcp(80), 32000), np(tcp(81), 30443)))
}

// TestExternalAddressClaims: an external or load-balancer IP may be shared
// by services on different ports (MetalLB's shared IPs) but not on the
// same port and protocol, whether external or load-balancer IP.
func TestExternalAddressClaims(t *testing.T) {
	base := snapshot(t, ext("web", "198.19.0.1", 80, "198.19.9.1", "198.19.9.2", "198.18.1.1"))
	for _, tt := range []struct {
		name   string
		in     *vipdv1.Service
		holder string
		msg    string
	}{
		{name: "same external IP, other port", in: ext("x", "198.19.0.9", 81, "198.19.9.1", "")},
		{name: "same load-balancer IP, other port", in: ext("x", "198.19.0.9", 81, "", "198.19.9.2")},
		{name: "another's external IP as a load-balancer IP, other port", in: ext("x", "198.19.0.9", 81, "", "198.19.9.1")},
		{name: "same external IP and port", in: ext("x", "198.19.0.9", 80, "198.19.9.1", ""), holder: "web",
			msg: "service x: 198.19.9.1:80/TCP (its external_ips[0]) is already used by service web (its external_ips[0])"},
		{name: "another's load-balancer IP as an external IP, same port", in: ext("x", "198.19.0.9", 80, "198.19.9.5,198.19.9.2", ""), holder: "web",
			msg: "service x: 198.19.9.2:80/TCP (its external_ips[1]) is already used by service web (its load_balancer_ips[0])"},
		{name: "same port on UDP", in: func() *vipdv1.Service {
			s := ext("x", "198.19.0.9", 80, "198.19.9.1", "")
			s.Ports[0] = udp(80)
			return s
		}()},
		{name: "the service itself, moved between lists", in: ext("web", "198.19.0.1", 80, "198.19.9.2", "198.19.9.1", "198.18.1.1")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tx := base.Begin()
			_, err := tx.Put(normalize(t, tt.in))
			if tt.holder == "" {
				if err != nil {
					t.Fatalf("Put: %v", err)
				}
				return
			}
			ce := conflict(t, err)
			if ce.Holder != tt.holder || ce.Claim.Kind != store.ClaimExternal || ce.Error() != tt.msg {
				t.Errorf("conflict %+v: %q; want holder %s, %q", ce, ce.Error(), tt.holder, tt.msg)
			}
		})
	}
}

// TestExternalAddressRoles: an external or load-balancer IP is never a
// VIP or a backend of any service, whichever is stored first, and the
// error says which service has it in which role.
func TestExternalAddressRoles(t *testing.T) {
	a := netip.MustParseAddr
	base := snapshot(t,
		with("web", "198.19.0.1", "198.18.1.1"),
		ext("lb", "198.19.0.2", 443, "198.19.9.1", "198.19.9.2", "198.18.2.1"),
	)
	for _, tt := range []struct {
		name string
		in   *vipdv1.Service
		want store.AddressConflictError
	}{
		{"an external IP that is another's VIP", ext("x", "198.19.0.9", 8080, "198.19.0.1", ""),
			store.AddressConflictError{Service: "x", Addr: a("198.19.0.1"), Role: store.RoleExternalIP, Holder: "web", HolderRole: store.RoleVIP}},
		{"a load-balancer IP that is another's backend", ext("x", "198.19.0.9", 8080, "", "198.18.1.1"),
			store.AddressConflictError{Service: "x", Addr: a("198.18.1.1"), Role: store.RoleLoadBalancerIP, Holder: "web", HolderRole: store.RoleBackend}},
		{"an external IP that is its own backend", ext("x", "198.19.0.9", 8080, "198.18.3.1", "", "198.18.3.1"),
			store.AddressConflictError{Service: "x", Addr: a("198.18.3.1"), Role: store.RoleBackend, Holder: "x", HolderRole: store.RoleExternalIP}},
		{"a VIP that is another's external IP", with("x", "198.19.9.1"),
			store.AddressConflictError{Service: "x", Addr: a("198.19.9.1"), Role: store.RoleVIP, Holder: "lb", HolderRole: store.RoleExternalIP}},
		{"a backend that is another's load-balancer IP", with("x", "198.19.0.9", "198.19.9.2"),
			store.AddressConflictError{Service: "x", Addr: a("198.19.9.2"), Role: store.RoleBackend, Holder: "lb", HolderRole: store.RoleLoadBalancerIP}},
		{"a service's new backend that is another's external IP", with("web", "198.19.0.1", "198.18.1.1", "198.19.9.1"),
			store.AddressConflictError{Service: "web", Addr: a("198.19.9.1"), Role: store.RoleBackend, Holder: "lb", HolderRole: store.RoleExternalIP}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := addrConflict(t, base.Begin(), tt.in)
			wantAddrConflict(t, c, tt.want)
			if !strings.Contains(c.Error(), "service "+tt.want.Holder) {
				t.Errorf("message %q does not name %s", c.Error(), tt.want.Holder)
			}
		})
	}

	// A service may turn its backend into its external IP, or a VIP into
	// a load-balancer IP, in one Put; and the old roles are released.
	tx := base.Begin()
	put(t, tx, ext("web", "198.19.0.3", 80, "198.18.1.1", "198.19.0.1", "198.18.1.2"))
	snap := tx.Commit()
	c := addrConflict(t, snap.Begin(), with("x", "198.19.0.9", "198.18.1.1"))
	wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.18.1.1"), Role: store.RoleBackend, Holder: "web", HolderRole: store.RoleExternalIP})
	put(t, snap.Begin(), with("x", "198.19.0.9", "198.18.1.9"))
	// And back.
	tx = snap.Begin()
	put(t, tx, with("web", "198.19.0.1", "198.18.1.1"))
	put(t, tx, with("x", "198.19.0.3", "198.18.5.5"))

	// Deleting a service frees its external addresses for any role.
	tx = base.Begin()
	tx.Delete("lb")
	put(t, tx, with("x", "198.19.9.1", "198.19.9.2"))

	// Two services sharing an external IP: it stays external until both
	// let go of it.
	tx = base.Begin()
	put(t, tx, ext("y", "198.19.0.7", 80, "198.19.9.1", ""))
	tx.Delete("lb")
	snap = tx.Commit()
	c = addrConflict(t, snap.Begin(), with("x", "198.19.9.1"))
	wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: a("198.19.9.1"), Role: store.RoleVIP, Holder: "y", HolderRole: store.RoleExternalIP})
}

// TestExternalFieldsSurviveSaveAndLoad: every external field is in the
// state file, and a loaded snapshot holds the same claims and roles.
func TestExternalFieldsSurviveSaveAndLoad(t *testing.T) {
	in := ext("lb", "198.19.0.2", 443, "198.19.9.1,fd00:198::9", "198.19.9.2", "198.18.2.1")
	in.Vips = append(in.Vips, "fd00:198::2")
	in.Ports[0].NodePort = 30443
	in.LoadBalancerSourceRanges = []string{"192.0.2.9/24", "fd00::/8"}
	in.ExternalTrafficPolicy = vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	in.HealthCheckNodePort = 32000
	s := snapshot(t, in)
	d := openDir(t)
	save(t, d, s)
	got, err := d.Load()
	if err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, s, got)
	e, _ := got.Get("lb")
	svc := e.Service()
	if svc.HealthCheckNodePort != 32000 || svc.Ports[0].NodePort != 30443 || len(svc.ExternalIps) != 2 ||
		svc.LoadBalancerSourceRanges[0] != "192.0.2.0/24" || svc.ExternalTrafficPolicy != vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		t.Errorf("loaded %v", svc)
	}
	if dp := e.Dataplane; dp.HealthCheckNodePort != 32000 || dp.Ports[0].NodePort != 30443 || len(dp.LoadBalancerIPs) != 1 ||
		len(dp.LoadBalancerSourceRanges) != 2 || dp.ExternalTrafficPolicy != dataplane.TrafficPolicyLocal {
		t.Errorf("loaded dataplane form %+v", dp)
	}
	tx := got.Begin()
	_, err = tx.Put(normalize(t, nodePorts("x", "198.19.0.9", 0, np(tcp(80), 32000))))
	conflict(t, err)
	c := addrConflict(t, got.Begin(), with("x", "fd00:198::9"))
	wantAddrConflict(t, c, store.AddressConflictError{Service: "x", Addr: netip.MustParseAddr("fd00:198::9"), Role: store.RoleVIP, Holder: "lb", HolderRole: store.RoleExternalIP})
}
