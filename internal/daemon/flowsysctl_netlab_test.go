package daemon_test

import (
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestFlowSysctlWarnings: with the iptables dataplane and without
// --set-sysctls, vipd leaves the conntrack flow sysctls as it finds them
// and warns about each; with --set-sysctls it sets them, logging each, and
// warns about none.
func TestFlowSysctlWarnings(t *testing.T) {
	keys := []string{"net.netfilter.nf_conntrack_acct", "net.netfilter.nf_conntrack_timestamp", "net.netfilter.nf_conntrack_events"}
	for _, set := range []bool{false, true} {
		node := netlab.New(t, netlab.Spec{}).Node(1)
		for _, key := range keys {
			if err := node.SetSysctl(key, "0"); err != nil {
				t.Fatal(err)
			}
		}
		cfg := iptablesIn(t, node)
		cfg.SetSysctls = set
		r := start(t, cfg, healthpb.HealthCheckResponse_SERVING)
		if !set {
			waitWarnings(t, r, "conntrack flow sysctls off", func(ws map[string]*vipdv1.StatusWarning) bool {
				return ws["sysctl/"+keys[0]] != nil && ws["sysctl/"+keys[1]] != nil && ws["sysctl/"+keys[2]] != nil
			})
		} else if ws, _ := warningsOf(t, r); len(ws) != 0 {
			t.Errorf("warnings with --set-sysctls: %v", ws)
		}
		for _, key := range keys {
			want := "0"
			if set {
				want = "1"
				if !strings.Contains(r.log.String(), "--set-sysctls: set sysctl: sysctl=") ||
					!strings.Contains(r.log.String(), strings.ReplaceAll(strings.TrimPrefix(key, "net.netfilter."), ".", "/")) {
					t.Errorf("--set-sysctls: no log line for %s:\n%s", key, r.log)
				}
			}
			if v, err := node.Sysctl(key); err != nil || v != want {
				t.Errorf("--set-sysctls %v: %s is %q (%v), want %s", set, key, v, err, want)
			}
		}
		r.stop()
	}
}
