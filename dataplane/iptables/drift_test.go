package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// TestDriftDetectedAndRepaired breaks vipd's rules the way other tools do,
// inside a lab node, and checks with real traffic that DetectDrift names
// each loss and that a full Apply repairs it and says so in the log.
func TestDriftDetectedAndRepaired(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var logs bytes.Buffer
			log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
			x := newClientLab(ctx, t, mode, log)
			node, client, web1, dp := x.node, x.client, x.web1, x.dp

			web := liveService("web", "198.19.0.10", 80, web1.IPv4())
			dns := liveService("dns", "198.19.0.13", 53, web1.IPv4())
			dns.Ports[0].Protocol = dataplane.UDP
			v6 := liveService("v6", "fd00:198:ff::10", 80, web1.IPv6())
			empty6 := liveService("empty6", "fd00:198:ff::11", 80)
			all := liveState(nil, web, dns, v6, empty6)
			if err := dp.Apply(ctx, all); err != nil {
				t.Fatal(err)
			}
			traffic := map[string][2]string{ // name: network, address
				"tcp": {"tcp", "198.19.0.10:80"}, "udp": {"udp", "198.19.0.13:53"}, "tcp6": {"tcp", "[fd00:198:ff::10]:80"},
			}
			works := func(what string, names ...string) {
				t.Helper()
				for _, n := range names {
					if r, err := client.Request(ctx, traffic[n][0], traffic[n][1]); err != nil || r.Backend != "web1" {
						t.Fatalf("%s: %s request to %s: %+v %v", what, n, traffic[n][1], r, err)
					}
				}
			}
			fails := func(what string, names ...string) {
				t.Helper()
				for _, n := range names {
					rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					r, err := client.Request(rctx, traffic[n][0], traffic[n][1])
					cancel()
					if err == nil {
						t.Fatalf("%s: %s request to %s reached %s", what, n, traffic[n][1], r.Backend)
					}
				}
			}
			refused := func() bool {
				_, err := client.Request(ctx, "tcp", "[fd00:198:ff::11]:80")
				return errors.Is(err, syscall.ECONNREFUSED)
			}
			detect := func() []dataplane.Drift {
				t.Helper()
				drift, err := dp.DetectDrift(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return drift
			}
			repair := func(what string) string {
				t.Helper()
				logs.Reset()
				if err := dp.Apply(ctx, all); err != nil {
					t.Fatalf("full apply after %s: %v", what, err)
				}
				if drift := detect(); drift != nil {
					t.Fatalf("after %s and a full apply: drift %v", what, drift)
				}
				return logs.String()
			}
			run := func(cmd string, args ...string) {
				t.Helper()
				if _, err := node.Exec(ctx, cmd+"-"+string(mode), args...); err != nil {
					t.Fatal(err)
				}
			}

			works("after the first apply", "tcp", "udp", "tcp6")
			if drift := detect(); drift != nil {
				t.Fatalf("drift right after a full apply: %v", drift)
			}
			if log := repair("nothing"); strings.Contains(log, "[INFO]") {
				t.Errorf("a full apply that changed nothing logged at INFO:\n%s", log)
			}

			// The reproduction: a firewall reload flushes PREROUTING.
			run("iptables", "-t", "nat", "-F", "PREROUTING")
			fails("PREROUTING flushed", "tcp", "udp")
			want := []dataplane.Drift{{What: "hook", Detail: "ipv4 nat PREROUTING: no jump to VIPD-SERVICES"}}
			if diff := cmp.Diff(want, detect()); diff != "" {
				t.Fatalf("PREROUTING flushed: drift (-want +got):\n%s", diff)
			}
			if log := repair("PREROUTING flushed"); !strings.Contains(log, "[INFO]  full sync changed the rules: family=ipv4") ||
				!strings.Contains(log, `hooks_added=["nat PREROUTING -> VIPD-SERVICES"]`) {
				t.Errorf("the repair of PREROUTING logged no INFO line naming the hook:\n%s", log)
			}
			works("PREROUTING repaired", "tcp", "udp", "tcp6")

			// The same in IPv6.
			run("ip6tables", "-t", "nat", "-F", "PREROUTING")
			fails("IPv6 PREROUTING flushed", "tcp6")
			want = []dataplane.Drift{{What: "hook", Detail: "ipv6 nat PREROUTING: no jump to VIPD-SERVICES"}}
			if diff := cmp.Diff(want, detect()); diff != "" {
				t.Fatalf("IPv6 PREROUTING flushed: drift (-want +got):\n%s", diff)
			}
			repair("IPv6 PREROUTING flushed")
			works("IPv6 PREROUTING repaired", "tcp", "udp", "tcp6")

			// A canary deleted on its own: nothing else is lost.
			run("iptables", "-t", "nat", "-X", "VIPD-CANARY")
			want = []dataplane.Drift{{What: "canary", Detail: "ipv4 nat VIPD-CANARY: missing"}}
			if diff := cmp.Diff(want, detect()); diff != "" {
				t.Fatalf("canary deleted: drift (-want +got):\n%s", diff)
			}
			if log := repair("canary deleted"); !strings.Contains(log, `chains=["nat VIPD-CANARY"]`) {
				t.Errorf("the repair of the canary logged no INFO line naming it:\n%s", log)
			}

			// A whole table flushed and its chains deleted (firewalld): the
			// backendless IPv6 service is no longer refused.
			if !refused() {
				t.Fatal("the backendless IPv6 service does not refuse")
			}
			run("ip6tables", "-t", "filter", "-F")
			run("ip6tables", "-t", "filter", "-X")
			if refused() {
				t.Fatal("the backendless IPv6 service still refuses after the filter table was flushed")
			}
			want = []dataplane.Drift{
				{What: "canary", Detail: "ipv6 filter VIPD-CANARY: missing"},
				{What: "hook", Detail: "ipv6 filter INPUT: no jump to VIPD-REJECT"},
				{What: "hook", Detail: "ipv6 filter FORWARD: no jump to VIPD-REJECT"},
				{What: "hook", Detail: "ipv6 filter OUTPUT: no jump to VIPD-REJECT"},
				{What: "chain", Detail: "ipv6 filter VIPD-REJECT: missing"},
				{What: "chain", Detail: "ipv6 filter VIPD-NODEPORTS: missing"},
			}
			if diff := cmp.Diff(want, detect()); diff != "" {
				t.Fatalf("IPv6 filter flushed: drift (-want +got):\n%s", diff)
			}
			repair("IPv6 filter flushed")
			if !refused() {
				t.Fatal("the backendless IPv6 service does not refuse after the repair")
			}

			// The node-ports chain, which no hook jumps to, deleted.
			run("iptables", "-t", "nat", "-X", "VIPD-NODEPORTS")
			want = []dataplane.Drift{{What: "chain", Detail: "ipv4 nat VIPD-NODEPORTS: missing"}}
			if diff := cmp.Diff(want, detect()); diff != "" {
				t.Fatalf("VIPD-NODEPORTS deleted: drift (-want +got):\n%s", diff)
			}
			repair("VIPD-NODEPORTS deleted")

			// A hook target flushed: the hooks are there, the rules are not.
			run("iptables", "-t", "nat", "-F", "VIPD-SERVICES")
			fails("VIPD-SERVICES flushed", "tcp", "udp")
			drift := detect()
			if len(drift) != 1 || drift[0].What != "chain" || !strings.HasPrefix(drift[0].Detail, "ipv4 nat VIPD-SERVICES: rules differ") {
				t.Fatalf("VIPD-SERVICES flushed: drift %v", drift)
			}
			repair("VIPD-SERVICES flushed")
			works("VIPD-SERVICES repaired", "tcp", "udp", "tcp6")

			if mode != iptables.ModeNFT {
				return
			}
			// `nft flush ruleset`: every table gone, builtin chains too.
			nftFlushRuleset(t, node)
			fails("ruleset flushed", "tcp", "udp", "tcp6")
			kinds := map[string]int{}
			for _, d := range detect() {
				kinds[d.What]++
			}
			// Per family: two canaries, six hooks, three hook targets and
			// two node-ports chains.
			if diff := cmp.Diff(map[string]int{"canary": 4, "hook": 12, "chain": 10}, kinds); diff != "" {
				t.Fatalf("ruleset flushed: drift kinds (-want +got):\n%s", diff)
			}
			repair("ruleset flushed")
			works("ruleset repaired", "tcp", "udp", "tcp6")
			if !refused() {
				t.Fatal("the backendless IPv6 service does not refuse after the ruleset was repaired")
			}
		})
	}
}

// TestLegacyDriftReadsEachTableOnce: in legacy mode, where listing one
// chain copies the whole table out of the kernel, DetectDrift reads each
// table once (iptables-legacy-save -t TABLE, per family and table) rather
// than listing each chain; drift is still found.
func TestLegacyDriftReadsEachTableOnce(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	calls := logToolCalls(t, "iptables-legacy", "ip6tables-legacy", "iptables-legacy-save", "ip6tables-legacy-save")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dp, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: node.Path(), Mode: iptables.ModeLegacy})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if err := dp.Apply(ctx, liveState(nil, liveService("web", "198.19.0.10", 80, netip.MustParseAddr("10.0.0.1")))); err != nil {
		t.Fatal(err)
	}
	os.Remove(calls)
	if drift, err := dp.DetectDrift(ctx); err != nil || len(drift) != 0 {
		t.Fatalf("DetectDrift: %v %v, want nothing", drift, err)
	}
	b, _ := os.ReadFile(calls)
	got := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := []string{"iptables-legacy-save -t nat", "iptables-legacy-save -t filter", "ip6tables-legacy-save -t nat", "ip6tables-legacy-save -t filter"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tool calls of one DetectDrift (-want +got):\n%s", diff)
	}
	if _, err := node.Exec(ctx, "iptables-legacy", "-t", "nat", "-F", "PREROUTING"); err != nil {
		t.Fatal(err)
	}
	drift, err := dp.DetectDrift(ctx)
	if err != nil || len(drift) != 1 || drift[0].Detail != "ipv4 nat PREROUTING: no jump to VIPD-SERVICES" {
		t.Fatalf("DetectDrift after flushing nat PREROUTING: %v %v", drift, err)
	}
}

// TestNFTDriftRunsNothingWhileOnlyVipdCommits: in nft mode, a DetectDrift
// after a full sync, or after partial syncs (one restore or several) and
// nothing else, runs no iptables tool: the nf_tables generation shows that
// only vipd's own restores committed since the rules were last verified,
// so the periodic check cannot hold up changes. Any other commit makes it
// list the chains again, and drift is still found, also when a partial
// sync followed the other commit.
func TestNFTDriftRunsNothingWhileOnlyVipdCommits(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	calls := logToolCalls(t, "iptables-nft", "ip6tables-nft")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dp, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: node.Path(), Mode: iptables.ModeNFT})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	toolCalls := func() []string {
		b, _ := os.ReadFile(calls)
		os.Remove(calls)
		return strings.Split(strings.TrimSpace(string(b)), "\n")[:strings.Count(string(b), "\n")]
	}
	check := func(what string, wantListing bool, wantDrift ...string) {
		t.Helper()
		toolCalls()
		drift, err := dp.DetectDrift(ctx)
		if err != nil {
			t.Fatalf("%s: DetectDrift: %v", what, err)
		}
		var got []string
		for _, d := range drift {
			got = append(got, d.Detail)
		}
		if diff := cmp.Diff(wantDrift, got); diff != "" {
			t.Errorf("%s: drift (-want +got):\n%s", what, diff)
		}
		if ran := toolCalls(); (len(ran) > 0) != wantListing {
			t.Errorf("%s: DetectDrift ran %d tool calls, want listings: %v", what, len(ran), wantListing)
		}
	}
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	apply := func(changed []string, svcs ...*dataplane.Service) {
		t.Helper()
		if err := dp.Apply(ctx, liveState(changed, svcs...)); err != nil {
			t.Fatal(err)
		}
	}
	apply(nil, liveService("web", "198.19.0.10", 80, a))
	check("after a full sync", false)
	apply([]string{"web"}, liveService("web", "198.19.0.10", 80, b))
	check("after a partial sync of one restore", false)
	// Losing the last backend takes two restores: filter, then nat.
	apply([]string{"web"}, liveService("web", "198.19.0.10", 80))
	if got := dp.LastSync(); got.Full || got.ChainsRewritten == 0 {
		t.Fatalf("last sync: %+v, want a partial one", got)
	}
	check("after a partial sync of two restores", false)

	// Another tool's commit that leaves vipd's rules alone.
	if _, err := node.Exec(ctx, "iptables-nft", "-t", "filter", "-N", "OTHER"); err != nil {
		t.Fatal(err)
	}
	check("after another tool's commit", true)
	check("after a check that found nothing", false)

	// Drift, then a partial sync: the check still looks.
	if _, err := node.Exec(ctx, "iptables-nft", "-t", "nat", "-F", "PREROUTING"); err != nil {
		t.Fatal(err)
	}
	apply([]string{"web"}, liveService("web", "198.19.0.10", 80, a))
	check("after a flush and a partial sync", true, "ipv4 nat PREROUTING: no jump to VIPD-SERVICES")
	check("again", true, "ipv4 nat PREROUTING: no jump to VIPD-SERVICES")
	apply(nil, liveService("web", "198.19.0.10", 80, a))
	check("after the repair", false)
}

// logToolCalls puts wrappers of tools first in PATH for the rest of the
// test: each appends its command line to the file whose path it returns,
// then runs the real tool.
func logToolCalls(t *testing.T, tools ...string) string {
	t.Helper()
	bin, calls := t.TempDir(), filepath.Join(t.TempDir(), "calls")
	for _, tool := range tools {
		real, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s: %v", tool, err)
		}
		script := fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >> %s\nexec %s \"$@\"\n", tool, calls, real)
		if err := os.WriteFile(filepath.Join(bin, tool), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	return calls
}
