package daemon_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// TestServicesDirTraffic runs the vipd binary with --services-dir and the
// iptables dataplane in a lab node, and checks on real connections that a
// file renamed into the directory makes its VIP answer, that a file
// rewritten in place moves it to the new backend, that a bad file leaves
// it answering, and that deleting the file makes the VIP refuse, each
// within a second, and that a SIGHUP does not disturb it.
func TestServicesDirTraffic(t *testing.T) {
	netlab.RequireRoot(t)
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "be1", "be2"}}}})
	node := lab.Node(1)
	cl, be1, be2 := node.Pod("client"), node.Pod("be1"), node.Pod("be2")
	for _, be := range []struct {
		pod  *netlab.Pod
		name string
	}{{be1, "be1"}, {be2, "be2"}} {
		if _, err := be.pod.StartEcho(be.name, 8080); err != nil {
			t.Fatal(err)
		}
	}
	vip := netip.MustParseAddrPort("198.19.0.10:80")
	dir := t.TempDir()
	p := startServing(t, "--dataplane", "iptables", "--netns", node.Path(), "--services-dir", dir)

	// answers waits up to a second until every one of three requests is
	// answered by want, or, for want "" (none), until one request fails,
	// plus the time that request takes to fail.
	answers := func(when, want string) {
		t.Helper()
		start := time.Now()
		n, within := 3, time.Second
		if want == "" {
			n, within = 1, time.Second+300*time.Millisecond
		}
		for {
			ok := true
			var got string
			for range n {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				r, err := cl.Request(ctx, "tcp", vip.String())
				cancel()
				got = r.Backend
				if (want == "" && err == nil) || (want != "" && (err != nil || r.Backend != want)) {
					ok = false
					break
				}
			}
			if ok {
				t.Logf("%s: %q answers after %v", when, want, time.Since(start))
				return
			}
			if time.Since(start) > within {
				t.Fatalf("%s: %v answered by %q; want %q within a second\nvipd:\n%s", when, vip, got, want, p.stderr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	path := filepath.Join(dir, "web.yaml")
	tmp := filepath.Join(dir, ".web.yaml.tmp")
	putFile(t, tmp, svcYAML("default/web", vip.Addr().String(), int(vip.Port()), be1.IPv4().String()))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	answers("renamed in", "be1")
	putFile(t, path, svcYAML("default/web", vip.Addr().String(), int(vip.Port()), be2.IPv4().String()))
	answers("written in place", "be2")
	putFile(t, path, "name: default/web\nvips: [not-an-ip]\n")
	time.Sleep(300 * time.Millisecond)
	answers("bad file", "be2")
	p.signal(syscall.SIGHUP)
	p.waitLog("rescanning the services directory")
	answers("after SIGHUP", "be2")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	answers("deleted", "")
}
