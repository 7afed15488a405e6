package health

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// TestTCPCheckerInLab: TCP checks made from a node namespace's sockets to
// a pod's echo server pass, every one of them, fresh sockets and reused
// ones alike, and fail as refused once the server is gone.
func TestTCPCheckerInLab(t *testing.T) {
	netlab.RequireRoot(t)
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"be1"}}}})
	node := lab.Node(1)
	be1 := node.Pod("be1")
	echo, err := be1.StartEcho("", 8080)
	if err != nil {
		t.Fatal(err)
	}
	ns := startNSSockets(node.Path())
	defer ns.close()
	tc, err := newTCPChecker(ns.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.close()
	addr := netip.AddrPortFrom(be1.IPv4(), 8080)
	for i := range 300 {
		if err, atOnce := runCheck(tc, addr, time.Second); err != nil {
			t.Fatalf("check %d (at once: %v): %v", i, atOnce, err)
		}
	}
	echo.Close()
	if err, _ := runCheck(tc, addr, time.Second); describe(err) == nil || describe(err).Error() != "connection refused" {
		t.Errorf("check of a stopped server: %v", err)
	}
}
