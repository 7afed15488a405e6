package soak

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	ciliumebpf "github.com/cilium/ebpf"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// TestTrafficCounts checks that the traffic counter counts what it must:
// answers from an allowed backend as successes, and refusals, answers from
// another backend and answers from an address other than the target as
// failures. Without this, a soak test's "0 failed" could not fail.
func TestTrafficCounts(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"c1", "be1"}}}})
	c1, be1 := lab.Pod("c1"), lab.Pod("be1")
	if _, err := be1.StartEcho("be1", 8080); err != nil {
		t.Fatal(err)
	}
	direct := ap(be1.IPv4(), 8080)
	for _, tc := range []struct {
		name         string
		target       Target
		wantFailures bool
	}{
		{"allowed backend", Target{Addr: direct, Backends: []string{"be1"}}, false},
		{"any backend", Target{Addr: direct}, false},
		{"other backend", Target{Addr: direct, Backends: []string{"be2"}}, true},
		{"refused", Target{Addr: ap(be1.IPv4(), 9)}, true},
		{"unreachable", Target{Addr: ap(netip.MustParseAddr("198.18.1.250"), 8080)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := StartTraffic(c1.NS, TrafficConfig{Workers: 2, Rate: 100, Timeout: time.Second}, tc.target)
			time.Sleep(300 * time.Millisecond)
			st := tr.Stop()
			if st.OK+st.Failed < 5 {
				t.Fatalf("only %d requests in 300 ms at 100/s: %v", st.OK+st.Failed, st)
			}
			if tc.wantFailures && (st.OK != 0 || len(st.Errors) == 0) {
				t.Errorf("want every request counted as failed, with its error: %v", st)
			}
			if !tc.wantFailures && (st.Failed != 0 || st.Backends["be1"] != st.OK) {
				t.Errorf("want every request counted as answered by be1: %v", st)
			}
			if st.Rate() > 150 {
				t.Errorf("%.0f requests a second, paced at 100", st.Rate())
			}
		})
	}
}

func TestMetricValue(t *testing.T) {
	text := `# HELP vipd_sync_errors_total Dataplane applies that failed.
# TYPE vipd_sync_errors_total counter
vipd_sync_errors_total 3
vipd_flow_events_lost_total{source="kernel"} 0
vipd_flow_events_lost_total{source="subscriber"} 1.5e+06
`
	for series, want := range map[string]float64{
		"vipd_sync_errors_total":                           3,
		`vipd_flow_events_lost_total{source="subscriber"}`: 1.5e6,
		`vipd_flow_events_lost_total{source="kernel"}`:     0,
	} {
		if got, err := metricValue(text, series); err != nil || got != want {
			t.Errorf("metricValue(%s) = %v, %v; want %v", series, got, err, want)
		}
	}
	if _, err := metricValue(text, "vipd_sync_errors"); err == nil {
		t.Error("a series name that is a prefix of another matched")
	}
}

func TestParseEntries(t *testing.T) {
	log := "=== start 1 of vipd\n" +
		`{"@level":"debug","@message":"applied","@module":"dataplane.iptables","full":true}` + "\n" +
		"not json\n" +
		`{"@level":"info","@message":"serving metrics and health","@module":"metrics","addr":"127.0.0.1:4242"}` + "\n"
	es := parseEntries(log)
	if len(es) != 2 {
		t.Fatalf("parsed %d entries, want 2: %v", len(es), es)
	}
	if full, ok := nextDataplaneApply(es); !ok || !full {
		t.Errorf("nextDataplaneApply = %v, %v; want a full apply", full, ok)
	}
	if es[1].Module() != "metrics" || es[1]["addr"] != "127.0.0.1:4242" {
		t.Errorf("second entry %v", es[1])
	}
}

// TestCheckKernelFindsDrift checks that CheckKernel, which the soak tests
// rely on to say "the kernel holds the desired state", notices when it
// does not: an entry removed from the eBPF maps, a rule added to a vipd
// chain.
func TestCheckKernelFindsDrift(t *testing.T) {
	forEachDataplane(t, func(t *testing.T, dp string) {
		e := NewEnv(t, vipdBin, dp, Spec{Clients: []string{"c1"}, Backends: []string{"be1", "be2"}})
		e.Upsert(service("soak/web", "soak", VIP(1), backend(e.Pod("be1")), backend(e.Pod("be2"))))
		if err := e.CheckKernel(); err != nil {
			t.Fatalf("CheckKernel right after an upsert: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		switch dp {
		case "iptables":
			save, err := e.Node.Exec(ctx, "iptables-nft-save", "-t", "nat")
			if err != nil {
				t.Fatal(err)
			}
			chain := regexp.MustCompile(`:(VIPD-SVC-[A-Z2-7]+) `).FindStringSubmatch(save)
			if chain == nil {
				t.Fatalf("no service chain in:\n%s", save)
			}
			if _, err := e.Node.Exec(ctx, "iptables-nft", "-t", "nat", "-A", chain[1], "-j", "RETURN"); err != nil {
				t.Fatal(err)
			}
		case "ebpf":
			// The service's reverse-NAT entry (which holds its members:
			// a frontend of a few members has no vipd_members entry).
			m, err := ciliumebpf.LoadPinnedMap(filepath.Join(e.Vipd.BPFFS, "vipd_revnat"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			key := make([]byte, m.KeySize())
			if err := m.NextKey(nil, &key); err != nil {
				t.Fatal(err)
			}
			if err := m.Delete(key); err != nil {
				t.Fatal(err)
			}
		}
		err := e.CheckKernel()
		if err == nil {
			t.Fatal("CheckKernel found nothing wrong with a kernel changed behind vipd's back")
		}
		t.Logf("%s: CheckKernel after the drift: %v", dp, err)
	})
}

// TestSweepDirs: the directory of a test process that no longer exists is
// removed; one of a live process (this one) is not.
func TestSweepDirs(t *testing.T) {
	dead := filepath.Join(os.TempDir(), dirPrefix+"999999999-sweep")
	live, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(live)
	if err := os.MkdirAll(filepath.Join(dead, "bpf"), 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dead)
	sweepDirs(t)
	if _, err := os.Stat(dead); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the directory of a dead process is still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the directory of this process was removed: %v", err)
	}
}
