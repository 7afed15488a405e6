package netlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netns"
)

const echoPort = 8080

// TestMain checks, as root, that the tests left the root namespace as they
// found it: links, addresses, routes and forwarding sysctls, and no
// namespaces of this process under /run/netns. The client processes of
// StartClient run this binary too: RunClientIfRequested comes first.
func TestMain(m *testing.M) {
	RunClientIfRequested()
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	before, err := rootState()
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot root namespace:", err)
		os.Exit(1)
	}
	code := m.Run()
	after, err := rootState()
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot root namespace:", err)
		os.Exit(1)
	}
	if after != before {
		fmt.Fprintf(os.Stderr, "root namespace changed:\n--- before\n%s\n--- after\n%s\n", before, after)
		code = 1
	}
	if left := ownNamespaces(); len(left) > 0 {
		fmt.Fprintln(os.Stderr, "namespaces left behind:", left)
		code = 1
	}
	os.Exit(code)
}

func rootState() (string, error) {
	var b strings.Builder
	for _, args := range [][]string{
		{"ip", "-o", "link"},
		{"ip", "-o", "addr"},
		{"ip", "route"},
		{"ip", "-6", "route"},
		{"sysctl", "-n", "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding", "net.ipv6.conf.default.accept_dad"},
	} {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%v: %w: %s", args, err, out)
		}
		b.Write(out)
	}
	return b.String(), nil
}

// ownNamespaces returns the namespaces under /run/netns named for this
// process.
func ownNamespaces() []string {
	entries, _ := os.ReadDir(runDir)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("vl%d-", os.Getpid())) {
			names = append(names, e.Name())
		}
	}
	return names
}

func twoNodeSpec() Spec {
	return Spec{Nodes: []NodeSpec{{Pods: []string{"a1", "a2"}}, {Pods: []string{"b1"}}}}
}

// endpoint is something that sends requests: a pod or a node.
type endpoint interface {
	Request(ctx context.Context, network, addr string, opts ...DialOption) (Reply, error)
	IPv4() netip.Addr
	IPv6() netip.Addr
	Name() string
}

var families = []struct {
	name string
	addr func(endpoint) netip.Addr
}{
	{"ipv4", endpoint.IPv4},
	{"ipv6", endpoint.IPv6},
}

// expectReply requests from `from` to pod `to` over every protocol and
// family, and checks that `to` answers at once and saw `from`'s own address.
func expectReply(t *testing.T, from endpoint, to *Pod) {
	t.Helper()
	for _, fam := range families {
		for _, proto := range []string{"tcp", "udp"} {
			dst := netip.AddrPortFrom(fam.addr(to), echoPort)
			start := time.Now()
			r, err := from.Request(t.Context(), proto, dst.String())
			// A retransmitted SYN or neighbor solicitation (1 s) means
			// that the lab was not ready when Build returned.
			if d := time.Since(start); d > 900*time.Millisecond {
				t.Errorf("%s %s %s -> %s: took %v", fam.name, proto, from.Name(), dst, d)
			}
			if err != nil {
				t.Errorf("%s %s %s -> %s: %v", fam.name, proto, from.Name(), dst, err)
				continue
			}
			if r.Backend != to.PodName() || r.Peer.Addr() != fam.addr(from) || r.Peer != r.Local || r.Remote != dst {
				t.Errorf("%s %s %s -> %s: got %+v, want backend %s, peer %s = local, remote %s",
					fam.name, proto, from.Name(), dst, r, to.PodName(), fam.addr(from), dst)
			}
		}
	}
}

func TestLab(t *testing.T) {
	lab := New(t, twoNodeSpec())
	n1, n2 := lab.Node(1), lab.Node(2)
	a1, a2, b1 := n1.Pod("a1"), n1.Pod("a2"), n2.Pod("b1")
	for _, p := range []*Pod{a1, a2, b1} {
		if _, err := p.StartEcho("", echoPort); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("Addresses", func(t *testing.T) {
		want := map[*Pod][2]string{
			a1: {"198.18.1.10", "fd00:198:1::a"},
			a2: {"198.18.1.11", "fd00:198:1::b"},
			b1: {"198.18.2.10", "fd00:198:2::a"},
		}
		for p, w := range want {
			if p.IPv4().String() != w[0] || p.IPv6().String() != w[1] {
				t.Errorf("pod %s: got %s %s, want %s %s", p.PodName(), p.IPv4(), p.IPv6(), w[0], w[1])
			}
		}
		if n2.IPv4().String() != "198.18.0.5" || n2.IPv6().String() != "fd00:198:0:2::2" {
			t.Errorf("node2: got %s %s", n2.IPv4(), n2.IPv6())
		}
		if got, want := a1.Path(), "/run/netns/"+a1.Name(); got != want {
			t.Errorf("Path: got %s, want %s", got, want)
		}
	})

	t.Run("PodToPodSameNode", func(t *testing.T) {
		expectReply(t, a1, a2)
		expectReply(t, a2, a1)
	})
	t.Run("PodToPodCrossNode", func(t *testing.T) {
		expectReply(t, a1, b1)
		expectReply(t, b1, a2)
	})
	t.Run("NodeToPod", func(t *testing.T) {
		expectReply(t, n1, a1)
		expectReply(t, n2, b1)
		expectReply(t, n1, b1) // through upstream
	})

	t.Run("LongLivedConn", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			dst := netip.AddrPortFrom(b1.IPv6(), echoPort)
			c, err := a1.Dial(t.Context(), proto, dst.String())
			if err != nil {
				t.Fatal(err)
			}
			var first Reply
			for i := range 200 {
				r, err := c.Request(t.Context())
				if err != nil {
					t.Fatalf("%s request %d: %v", proto, i, err)
				}
				if i == 0 {
					first = r
				}
				if r != first || r.Backend != "b1" || r.Peer.Addr() != a1.IPv6() {
					t.Fatalf("%s request %d: got %+v, first %+v", proto, i, r, first)
				}
			}
			c.Close()
		}
	})

	t.Run("ManyConcurrentConns", func(t *testing.T) {
		const conns = 300
		dst := netip.AddrPortFrom(a1.IPv4(), echoPort).String()
		var (
			wg    sync.WaitGroup
			ready sync.WaitGroup
			errc  = make(chan error, conns)
		)
		ready.Add(conns)
		start := time.Now()
		for range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := b1.Dial(t.Context(), "tcp", dst)
				if err != nil {
					ready.Done()
					errc <- err
					return
				}
				defer c.Close()
				_, err = c.Request(t.Context())
				ready.Done()
				ready.Wait() // all connections open at once
				if err == nil {
					_, err = c.Request(t.Context())
				}
				if err != nil {
					errc <- err
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		t.Logf("%d concurrent connections, 2 requests each: %v", conns, time.Since(start))
	})

	t.Run("RefusedNotTimedOut", func(t *testing.T) {
		for _, fam := range families {
			for _, proto := range []string{"tcp", "udp"} {
				dst := netip.AddrPortFrom(fam.addr(a2), 9).String()
				start := time.Now()
				_, err := a1.Request(t.Context(), proto, dst)
				if !errors.Is(err, syscall.ECONNREFUSED) || IsTimeout(err) {
					t.Errorf("%s %s -> %s: got %v, want ECONNREFUSED", fam.name, proto, dst, err)
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("%s %s -> %s: refusal took %v", fam.name, proto, dst, d)
				}
			}
		}
	})

	t.Run("TimedOutNotRefused", func(t *testing.T) {
		// a2 silently drops everything it sends to b1: no reply, no ICMP.
		blackhole := b1.IPv4().String() + "/32"
		if _, err := a2.Exec(t.Context(), "ip", "route", "add", "blackhole", blackhole); err != nil {
			t.Fatal(err)
		}
		defer a2.Exec(t.Context(), "ip", "route", "del", "blackhole", blackhole)
		for _, proto := range []string{"tcp", "udp"} {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			_, err := b1.Request(ctx, proto, netip.AddrPortFrom(a2.IPv4(), echoPort).String())
			cancel()
			if !IsTimeout(err) || errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: got %v, want a timeout", proto, err)
			}
		}
	})

	t.Run("NothingLeaves", func(t *testing.T) {
		targets := []string{
			"198.18.200.1:80",     // no node 200: upstream has no route
			"198.18.0.100:80",     // unused fabric address
			"198.18.1.250:80",     // unassigned address in node1's pod range
			"[fd00:198:c8::1]:80", // no node 200
			"[fd00:198:1::fa]:80", // unassigned in node1's range
		}
		var wg sync.WaitGroup
		for _, from := range []endpoint{a1, b1, n1} {
			for _, dst := range targets {
				for _, proto := range []string{"tcp", "udp"} {
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(t.Context(), time.Second)
						defer cancel()
						start := time.Now()
						r, err := from.Request(ctx, proto, dst)
						switch {
						case err == nil:
							t.Errorf("%s %s -> %s: got reply %+v, want failure", proto, from.Name(), dst, r)
						case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
							errors.Is(err, syscall.ECONNREFUSED), IsTimeout(err):
							t.Logf("%s %s -> %s: %v after %v", proto, from.Name(), dst, err, time.Since(start).Round(time.Millisecond))
						default:
							t.Errorf("%s %s -> %s: unexpected error %v", proto, from.Name(), dst, err)
						}
					})
				}
			}
		}
		wg.Wait()
	})

	t.Run("LocalPorts", func(t *testing.T) {
		for _, fam := range families {
			for _, proto := range []string{"tcp", "udp"} {
				dst := netip.AddrPortFrom(fam.addr(b1), echoPort).String()
				r, err := a1.Request(t.Context(), proto, dst, WithLocalPortRange(41000, 41009))
				if err != nil {
					t.Fatal(err)
				}
				if p := r.Local.Port(); p < 41000 || p > 41009 || r.Peer.Port() != p {
					t.Errorf("%s %s range: got %+v", fam.name, proto, r)
				}
				// The same port twice, to two servers: SO_REUSEADDR lets
				// the second bind despite the first connection's TIME_WAIT.
				for _, to := range []*Pod{b1, a2} {
					dst := netip.AddrPortFrom(fam.addr(to), echoPort).String()
					r, err = a1.Request(t.Context(), proto, dst, WithLocalPort(42042))
					if err != nil {
						t.Fatal(err)
					}
					if r.Local.Port() != 42042 || r.Peer.Port() != 42042 {
						t.Errorf("%s %s port: got %+v", fam.name, proto, r)
					}
				}
			}
		}
	})

	t.Run("DynamicPod", func(t *testing.T) {
		b2, err := n2.AddPod(t.Context(), "b2")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b2.StartEcho("", echoPort); err != nil {
			t.Fatal(err)
		}
		if b2.IPv4().String() != "198.18.2.11" {
			t.Errorf("b2: got %s", b2.IPv4())
		}
		expectReply(t, a1, b2)
		if _, err := n1.AddPod(t.Context(), "b2"); err == nil {
			t.Error("duplicate pod name accepted")
		}
		if err := n2.RemovePod("b2"); err != nil {
			t.Fatal(err)
		}
		if n2.Pod("b2") != nil || lab.Pod("b2") != nil {
			t.Error("removed pod still listed")
		}
		if err := b2.Do(func() error { return nil }); !errors.Is(err, ErrClosed) {
			t.Errorf("Do in removed pod: got %v, want ErrClosed", err)
		}
		if _, err := os.Stat(b2.Path()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("removed pod's netns: %v", err)
		}
		if out, _ := n2.Exec(t.Context(), "ip", "-o", "link"); strings.Contains(out, b2.HostVeth()) {
			t.Errorf("removed pod's veth still on node2:\n%s", out)
		}
		_, err = a1.Request(t.Context(), "tcp", netip.AddrPortFrom(b2.IPv4(), echoPort).String())
		if !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("request to removed pod: got %v, want EHOSTUNREACH", err)
		}
	})

	t.Run("Sysctls", func(t *testing.T) {
		for _, c := range []struct {
			ns         *NS
			key, value string
		}{
			{n1.NS, "net.ipv4.ip_forward", "1"},
			{n1.NS, "net.ipv6.conf.all.forwarding", "1"},
			{n1.NS, "net.ipv4.conf." + a1.HostVeth() + ".proxy_arp", "1"},
			{n1.NS, "net.ipv4.neigh." + a1.HostVeth() + ".proxy_delay", "0"},
			{lab.Upstream(), "net.ipv4.ip_forward", "1"},
			{a1.NS, "net.ipv6.conf.eth0.accept_dad", "0"},
			{b1.NS, "net.ipv6.conf.default.accept_dad", "0"},
		} {
			// Read back through another process, so that the check does not
			// depend on how netlab writes.
			out, err := c.ns.Exec(t.Context(), "sysctl", "-n", c.key)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(out); got != c.value {
				t.Errorf("%s in %s: got %s, want %s", c.key, c.ns.Name(), got, c.value)
			}
			if got, err := c.ns.Sysctl(c.key); err != nil || got != c.value {
				t.Errorf("Sysctl(%s) in %s: got %q, %v; want %s", c.key, c.ns.Name(), got, err, c.value)
			}
		}
	})

	t.Run("UpstreamIsolated", func(t *testing.T) {
		up := lab.Upstream()
		out, err := up.Exec(t.Context(), "ip", "-o", "link")
		if err != nil {
			t.Fatal(err)
		}
		var links []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			name, _, _ := strings.Cut(strings.Fields(line)[1], "@")
			links = append(links, strings.TrimSuffix(name, ":"))
		}
		if want := []string{"lo", "node1", "node2"}; !slices.Equal(links, want) {
			t.Errorf("upstream links: got %v, want %v", links, want)
		}
		for _, fam := range []string{"-4", "-6"} {
			if out, err := up.Exec(t.Context(), "ip", fam, "route", "show", "default"); err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("upstream %s default route: %q, %v", fam, out, err)
			}
		}
	})

	t.Run("DoKeepsCallerNamespace", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		before, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer before.Close()
		for range 50 {
			err := a1.Do(func() error {
				cur, err := netns.Get()
				if err != nil {
					return err
				}
				defer cur.Close()
				if !cur.Equal(a1.handle) {
					return errors.New("Do ran outside the namespace")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		after, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer after.Close()
		if !after.Equal(before) {
			t.Fatal("caller's thread changed namespace")
		}
	})
}

func TestCloseRemovesEverything(t *testing.T) {
	RequireRoot(t)
	rootVeths := func() string {
		out, err := exec.Command("ip", "-o", "link", "show", "type", "veth").CombinedOutput()
		if err != nil {
			t.Fatalf("ip link: %v: %s", err, out)
		}
		return string(out)
	}
	vethsBefore := rootVeths()
	assertGone := func(t *testing.T, names []string) {
		t.Helper()
		for _, name := range names {
			if _, err := os.Stat(filepath.Join(runDir, name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("netns %s still there: %v", name, err)
			}
		}
		if got := rootVeths(); got != vethsBefore {
			t.Errorf("root namespace veths changed:\n%s", got)
		}
	}

	t.Run("Close", func(t *testing.T) {
		lab, err := Build(t.Context(), twoNodeSpec(), hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		names := lab.Namespaces()
		if len(names) != 6 {
			t.Errorf("namespaces: got %v, want 6", names)
		}
		for _, name := range names {
			if _, err := os.Stat(filepath.Join(runDir, name)); err != nil {
				t.Errorf("netns %s: %v", name, err)
			}
		}
		if _, err := lab.Pod("a1").StartEcho("a1", echoPort); err != nil {
			t.Fatal(err)
		}
		if err := lab.Close(); err != nil {
			t.Fatal(err)
		}
		assertGone(t, names)
		if err := lab.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := lab.Node(1).AddPod(t.Context(), "late"); !errors.Is(err, ErrClosed) {
			t.Errorf("AddPod after Close: got %v, want ErrClosed", err)
		}
	})

	t.Run("TestCleanup", func(t *testing.T) {
		var names []string
		t.Run("inner", func(t *testing.T) {
			names = New(t, Spec{}).Namespaces()
		})
		if len(names) != 2 {
			t.Errorf("namespaces: got %v, want upstream and one node", names)
		}
		assertGone(t, names)
	})

	t.Run("BuildFailure", func(t *testing.T) {
		// The duplicate is found only after node 1 and its pods exist.
		spec := Spec{Nodes: []NodeSpec{{Pods: []string{"x1", "x2"}}, {Pods: []string{"x1"}}}}
		_, err := Build(t.Context(), spec, hclog.NewNullLogger())
		if err == nil {
			t.Fatal("Build accepted a duplicate pod name")
		}
		if left := ownNamespaces(); len(left) > 0 {
			t.Errorf("failed Build left %v", left)
		}
		assertGone(t, nil)
	})

	t.Run("BadSpec", func(t *testing.T) {
		for _, name := range []string{"", "-x", "UPPER", "twelve-chars", "a.b"} {
			if _, err := Build(t.Context(), Spec{Nodes: []NodeSpec{{Pods: []string{name}}}}, hclog.NewNullLogger()); err == nil {
				t.Errorf("pod name %q accepted", name)
			}
		}
	})
}

func TestSweep(t *testing.T) {
	RequireRoot(t)
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	deadPid := cmd.Process.Pid
	if alive(deadPid) {
		t.Skipf("pid %d was reused already", deadPid)
	}
	log := hclog.NewNullLogger()
	dead, err := createNS(fmt.Sprintf("vl%d-dead-node1", deadPid), log)
	if err != nil {
		t.Fatal(err)
	}
	defer dead.close()
	live, err := createNS(fmt.Sprintf("vl%d-beef-node1", os.Getpid()), log)
	if err != nil {
		t.Fatal(err)
	}
	defer live.close()

	removed, err := Sweep(log)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, dead.Name()) || slices.Contains(removed, live.Name()) {
		t.Errorf("Sweep removed %v; want %s and not %s", removed, dead.Name(), live.Name())
	}
	if _, err := os.Stat(dead.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead pid's netns: %v", err)
	}
	if _, err := os.Stat(live.Path()); err != nil {
		t.Errorf("live pid's netns: %v", err)
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil || strings.Contains(string(out), dead.Name()) {
		t.Errorf("ip netns list: %v\n%s", err, out)
	}
}
