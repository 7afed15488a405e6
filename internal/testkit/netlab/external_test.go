package netlab

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/dataplane"
)

func TestExternalHost(t *testing.T) {
	lab := New(t, Spec{
		Nodes:         []NodeSpec{{Pods: []string{"a1"}}, {Pods: []string{"b1"}}},
		ExternalHosts: []string{"out"},
	})
	n1, n2 := lab.Node(1), lab.Node(2)
	a1, b1 := n1.Pod("a1"), n2.Pod("b1")
	out := lab.ExternalHost("out")
	if out == nil {
		t.Fatal("Spec.ExternalHosts: no external host out")
	}
	for _, p := range []*Pod{a1, b1} {
		if _, err := p.StartEcho("", echoPort); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("Addresses", func(t *testing.T) {
		if out.IPv4().String() != "198.18.250.3" || out.IPv6().String() != "fd00:198:fa:1::2" || out.Index() != 1 {
			t.Errorf("out: got %d %s %s", out.Index(), out.IPv4(), out.IPv6())
		}
		if out.HostName() != "out" || out.RouterLink() != "extout" || !strings.HasSuffix(out.Name(), "-ext-out") {
			t.Errorf("out: names %q %q %q", out.HostName(), out.RouterLink(), out.Name())
		}
		for _, a := range []netip.Addr{out.IPv4(), out.IPv6()} {
			if ServiceRangeV4.Contains(a) || ServiceRangeV6.Contains(a) || n1.PodCIDRv4().Contains(a) {
				t.Errorf("external address %s clashes with the plan", a)
			}
		}
	})

	t.Run("ToPods", func(t *testing.T) {
		expectReply(t, out, a1)
		expectReply(t, out, b1)
	})

	t.Run("NodeUplinkAddresses", func(t *testing.T) {
		if _, err := n2.StartEcho("node2", echoPort); err != nil {
			t.Fatal(err)
		}
		for _, fam := range families {
			for _, proto := range []string{"tcp", "udp"} {
				dst := netip.AddrPortFrom(fam.addr(n2), echoPort)
				r, err := out.Request(t.Context(), proto, dst.String())
				if err != nil {
					t.Fatalf("%s %s -> node2 %s: %v", fam.name, proto, dst, err)
				}
				if r.Backend != "node2" || r.Peer.Addr() != fam.addr(out) || r.Remote != dst {
					t.Errorf("%s %s -> node2 %s: got %+v", fam.name, proto, dst, r)
				}
			}
		}
	})

	t.Run("AsBackend", func(t *testing.T) {
		if _, err := out.StartEcho("", echoPort+1); err != nil {
			t.Fatal(err)
		}
		for _, from := range []endpoint{a1, b1, n1} {
			for _, fam := range families {
				for _, proto := range []string{"tcp", "udp"} {
					dst := netip.AddrPortFrom(fam.addr(out), echoPort+1)
					r, err := from.Request(t.Context(), proto, dst.String())
					if err != nil {
						t.Fatalf("%s %s %s -> out: %v", fam.name, proto, from.Name(), err)
					}
					if r.Backend != "out" || r.Peer.Addr() != fam.addr(from) {
						t.Errorf("%s %s %s -> out: got %+v", fam.name, proto, from.Name(), r)
					}
				}
			}
		}
	})

	t.Run("RouteToNode", func(t *testing.T) {
		// Stand-ins for a dataplane: node2 and then node1 own an external
		// IP on lo, so that what answers shows where the router sent it.
		ext4, ext6 := netip.MustParseAddr("198.19.200.1"), netip.MustParseAddr("fd00:198:ffff::1")
		for _, n := range []*Node{n1, n2} {
			for _, a := range []netip.Addr{ext4, ext6} {
				args := []string{"addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo"}
				if a.Is6() {
					// Usable at once: no duplicate address detection
					// (CI saw bind fail on a still tentative address).
					args = append(args, "nodad")
				}
				if _, err := n.Exec(t.Context(), "ip", args...); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := n.startEcho("at-"+n.Name()[len(n.Name())-5:], []netip.Addr{ext4, ext6}, []uint16{80}); err != nil {
				t.Fatal(err)
			}
		}
		requestExt := func(want string) {
			t.Helper()
			for _, a := range []netip.Addr{ext4, ext6} {
				for _, proto := range []string{"tcp", "udp"} {
					dst := netip.AddrPortFrom(a, 80).String()
					r, err := out.Request(t.Context(), proto, dst)
					if err != nil {
						t.Fatalf("%s out -> %s: %v", proto, dst, err)
					}
					if r.Backend != want || r.Peer.Addr() != out.IPv4() && r.Peer.Addr() != out.IPv6() {
						t.Errorf("%s out -> %s: got %+v, want backend %s", proto, dst, r, want)
					}
				}
			}
		}

		// Without a route, the router has nowhere to send it.
		_, err := out.Request(t.Context(), "tcp", netip.AddrPortFrom(ext4, 80).String())
		if !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ENETUNREACH) {
			t.Errorf("no route yet: got %v, want unreachable", err)
		}
		for _, p := range []string{"198.19.200.0/24", "fd00:198:ffff::/64"} {
			if err := lab.RouteToNode(netip.MustParsePrefix(p), n2); err != nil {
				t.Fatal(err)
			}
		}
		requestExt("at-node2")
		// Again, to node1: the route is replaced.
		for _, p := range []string{"198.19.200.0/24", "fd00:198:ffff::/64"} {
			if err := lab.RouteToNode(netip.MustParsePrefix(p), n1); err != nil {
				t.Fatal(err)
			}
		}
		requestExt("at-node1")

		for _, p := range []string{"0.0.0.0/0", "198.18.1.0/24", "198.0.0.0/8", "10.0.0.0/8", "fd00:198:1::/64", "fd00:198::/32", "::/0"} {
			if err := lab.RouteToNode(netip.MustParsePrefix(p), n1); err == nil {
				t.Errorf("RouteToNode(%s) accepted", p)
			}
		}
		if err := lab.RouteToNode(netip.Prefix{}, n1); err == nil {
			t.Error("RouteToNode(invalid prefix) accepted")
		}
	})

	t.Run("DataplaneNode", func(t *testing.T) {
		out, err := n1.Exec(t.Context(), "cat", "/sys/class/net/eth0/ifindex")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(out)); got != n1.UplinkIndex() {
			t.Errorf("UplinkIndex: got %d, the kernel says %d", n1.UplinkIndex(), got)
		}
		addrs := []netip.Addr{netip.MustParseAddr("198.18.0.3"), netip.MustParseAddr("fd00:198:0:1::2")}
		want := dataplane.Node{
			NodePortAddresses: addrs,
			Interfaces:        []dataplane.Interface{{Name: "eth0", Index: n1.UplinkIndex(), Addrs: addrs, External: true}},
		}
		got := n1.DataplaneNode()
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("DataplaneNode (-want +got):\n%s", diff)
		}
	})

	t.Run("SecondaryAddresses", func(t *testing.T) {
		if n2.SecondaryIPv4().String() != "198.18.251.2" || n2.SecondaryIPv6().String() != "fd00:198:fb::2" {
			t.Errorf("node2 secondary: got %s %s", n2.SecondaryIPv4(), n2.SecondaryIPv6())
		}
		if err := n2.AddSecondaryAddresses(t.Context()); err != nil {
			t.Fatal(err)
		}
		// A refusal is node2's kernel answering: the address is reachable
		// from outside and from a pod on another node, and served by nobody.
		for _, from := range []endpoint{out, a1} {
			for _, a := range []netip.Addr{n2.SecondaryIPv4(), n2.SecondaryIPv6()} {
				dst := netip.AddrPortFrom(a, 9).String()
				if _, err := from.Request(t.Context(), "tcp", dst); !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("%s -> %s: got %v, want ECONNREFUSED from node2", from.Name(), dst, err)
				}
			}
		}
		want := []netip.Addr{n2.IPv4(), n2.SecondaryIPv4(), n2.IPv6(), n2.SecondaryIPv6()}
		if got := n2.DataplaneNode(); !slices.Equal(got.NodePortAddresses, want) || !slices.Equal(got.Interfaces[0].Addrs, want) {
			t.Errorf("DataplaneNode after AddSecondaryAddresses: got %+v, want addresses %v", got, want)
		}
		if err := n2.AddSecondaryAddresses(t.Context()); err == nil {
			t.Error("second AddSecondaryAddresses succeeded")
		}
	})

	t.Run("AddAndRemove", func(t *testing.T) {
		out2, err := lab.AddExternalHost(t.Context(), "out2")
		if err != nil {
			t.Fatal(err)
		}
		if out2.Index() != 2 || out2.IPv4().String() != "198.18.250.5" {
			t.Errorf("out2: got %d %s", out2.Index(), out2.IPv4())
		}
		expectReply(t, out2, b1)
		if _, err := lab.AddExternalHost(t.Context(), "out2"); err == nil {
			t.Error("duplicate external host name accepted")
		}
		if _, err := lab.AddExternalHost(t.Context(), "Bad.Name"); err == nil {
			t.Error("bad external host name accepted")
		}
		if err := lab.RemoveExternalHost("out2"); err != nil {
			t.Fatal(err)
		}
		if lab.ExternalHost("out2") != nil || len(lab.ExternalHosts()) != 1 {
			t.Errorf("removed external host still listed: %v", lab.ExternalHosts())
		}
		if _, err := os.Stat(out2.Path()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("removed external host's netns: %v", err)
		}
		if out, _ := lab.Upstream().Exec(t.Context(), "ip", "-o", "link"); strings.Contains(out, out2.RouterLink()) {
			t.Errorf("removed external host's link still on upstream:\n%s", out)
		}
		if err := lab.RemoveExternalHost("out2"); err == nil {
			t.Error("second RemoveExternalHost succeeded")
		}
		// Numbers are not reused.
		out3, err := lab.AddExternalHost(t.Context(), "out3")
		if err != nil {
			t.Fatal(err)
		}
		if out3.Index() != 3 {
			t.Errorf("out3: got number %d, want 3", out3.Index())
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := b1.Request(ctx, "tcp", netip.AddrPortFrom(out2.IPv4(), echoPort).String()); err == nil {
			t.Error("request to a removed external host's address succeeded")
		}
	})
}

func TestExternalHostCleanup(t *testing.T) {
	RequireRoot(t)
	lab, err := Build(t.Context(), Spec{ExternalHosts: []string{"x1", "x2"}}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	names := lab.Namespaces()
	if len(names) != 4 || !strings.HasSuffix(names[2], "-ext-x1") || !strings.HasSuffix(names[3], "-ext-x2") {
		t.Errorf("namespaces: got %v, want upstream, node1, ext-x1, ext-x2", names)
	}
	if _, err := lab.ExternalHost("x1").StartEcho("", echoPort); err != nil {
		t.Fatal(err)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if _, err := os.Stat(runDir + "/" + name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("netns %s still there: %v", name, err)
		}
	}
	if _, err := lab.AddExternalHost(t.Context(), "late"); !errors.Is(err, ErrClosed) {
		t.Errorf("AddExternalHost after Close: got %v, want ErrClosed", err)
	}
	if err := lab.RouteToNode(netip.MustParsePrefix("198.19.200.0/24"), lab.Node(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("RouteToNode after Close: got %v, want ErrClosed", err)
	}

	t.Run("BuildFailure", func(t *testing.T) {
		// The duplicate is found only after x1 exists.
		_, err := Build(t.Context(), Spec{ExternalHosts: []string{"x1", "x1"}}, hclog.NewNullLogger())
		if err == nil {
			t.Fatal("Build accepted a duplicate external host name")
		}
		if left := ownNamespaces(); len(left) > 0 {
			t.Errorf("failed Build left %v", left)
		}
	})
	t.Run("BadSpec", func(t *testing.T) {
		if _, err := Build(t.Context(), Spec{ExternalHosts: []string{"UPPER"}}, hclog.NewNullLogger()); err == nil {
			t.Error("external host name UPPER accepted")
		}
	})
}
