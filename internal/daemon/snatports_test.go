package daemon

import (
	"strings"
	"testing"

	"github.com/vipd/vipd/dataplane/ebpf"
)

// TestSNATPortRange: --snat-port-range feeds the eBPF dataplane's SNAT
// ports (unset keeps ebpf.Config's, whose zero is the default), and a
// value that is not MIN-MAX with 1 <= MIN <= MAX <= 65535 is refused by
// Check with an error naming the flag.
func TestSNATPortRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ebpf.PortRange
	}{
		{"", ebpf.PortRange{}},
		{"61000-65535", ebpf.PortRange{Min: 61000, Max: 65535}},
		{"1024-1024", ebpf.PortRange{Min: 1024, Max: 1024}},
		{" 2000 - 3000 ", ebpf.PortRange{Min: 2000, Max: 3000}},
	} {
		cfg := Config{SNATPortRange: tc.in, NetNS: "/run/netns/x"}
		got, err := cfg.ebpfConfig()
		if err != nil || got.SNATPorts != tc.want || got.NetNS != cfg.NetNS {
			t.Errorf("--snat-port-range %q: SNATPorts %+v, NetNS %q, err %v; want %+v", tc.in, got.SNATPorts, got.NetNS, err, tc.want)
		}
		if errs := cfg.checkNodeNet(); len(errs) != 0 {
			t.Errorf("--snat-port-range %q refused: %v", tc.in, errs)
		}
	}
	for _, in := range []string{"61000", "0-100", "200-100", "1-65536", "a-b", "-5", "61000-", "1-2-3"} {
		cfg := Config{SNATPortRange: in}
		if _, err := cfg.ebpfConfig(); err == nil || !strings.Contains(err.Error(), "--snat-port-range") {
			t.Errorf("--snat-port-range %q: err %v, want one naming the flag", in, err)
		}
		errs := cfg.checkNodeNet()
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), "--snat-port-range") {
			t.Errorf("--snat-port-range %q: Check errors %v, want one naming the flag", in, errs)
		}
	}
}
