package ebpf

import (
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/internal/nsdo"
)

// TestSNATSkipOf: the part of the SNAT ports inside ip_local_port_range
// is skipped; none when they do not meet; an error when nothing is left.
func TestSNATSkipOf(t *testing.T) {
	local := PortRange{Min: 32768, Max: 60999}
	for _, c := range []struct {
		snat, want PortRange
		err        bool
	}{
		{snat: DefaultSNATPorts, want: local},
		{snat: PortRange{Min: 61000, Max: 65535}},
		{snat: PortRange{Min: 1024, Max: 32767}},
		{snat: PortRange{Min: 30000, Max: 40000}, want: PortRange{Min: 32768, Max: 40000}},
		{snat: PortRange{Min: 60000, Max: 61000}, want: PortRange{Min: 60000, Max: 60999}},
		{snat: PortRange{Min: 40000, Max: 40010}, err: true},
		{snat: local, err: true},
	} {
		got, err := snatSkipOf(c.snat, local)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("snatSkipOf(%v, %v) = %v, %v; want %v, error %v", c.snat, local, got, err, c.want, c.err)
		}
	}
}

// TestDataplaneSNATSkipsLocalPorts: New reads the namespace's
// ip_local_port_range and has the programs skip it within the default
// SNAT ports; a range inside it fails New.
func TestDataplaneSNATSkipsLocalPorts(t *testing.T) {
	e := newDPEnv(t, nil, MapSizes{})
	if err := nsdo.Do(e.node.Path(), func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 50001"), 0o644)
	}); err != nil {
		t.Fatalf("set ip_local_port_range: %v", err)
	}
	dp := e.open(nil)
	var cfg bpfConfig
	if err := dp.objs.VipdConfig.Lookup(uint32(0), &cfg); err != nil {
		t.Fatalf("read config: %v", err)
	}
	if cfg.SnatPortMin != 1024 || cfg.SnatPortMax != 65535 || cfg.SnatSkipMin != 40000 || cfg.SnatSkipMax != 50001 {
		t.Fatalf("SNAT ports %d-%d skipping %d-%d, want 1024-65535 skipping 40000-50001",
			cfg.SnatPortMin, cfg.SnatPortMax, cfg.SnatSkipMin, cfg.SnatSkipMax)
	}
	e.close()
	e.cfg.SNATPorts = PortRange{Min: 45000, Max: 46000}
	dp, err := New(t.Context(), hclog.NewNullLogger(), e.cfg)
	if err == nil {
		e.dp = dp
		t.Fatalf("New took SNAT ports %v inside ip_local_port_range 40000-50001", e.cfg.SNATPorts)
	}
	if !strings.Contains(err.Error(), "ip_local_port_range") {
		t.Fatalf("New: %v, want an error naming ip_local_port_range", err)
	}
}
