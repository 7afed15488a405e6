package daemon

import (
	"cmp"
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/dataplane/none"
	"github.com/vishvananda/netns"
)

// openDataplane opens the dataplane cfg.Dataplane names, programming
// cfg.NetNS.
func openDataplane(ctx context.Context, log hclog.Logger, cfg Config) (dataplane.Dataplane, error) {
	if cfg.NetNS != "" {
		h, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", cfg.NetNS, err)
		}
		h.Close()
	}
	switch cfg.Dataplane {
	case DataplaneFake:
		log.Warn("--dataplane fake is deprecated and will be removed in the next release: it now means --dataplane none; use that")
		fallthrough
	case DataplaneNone:
		log.Warn("using the none dataplane: nothing is programmed into the kernel")
		return none.New(), nil
	case DataplaneEBPF:
		return openEBPF(ctx, log, cfg)
	case DataplaneAuto:
		dp, err := openEBPF(ctx, log, cfg)
		if err != nil {
			log.Warn("auto falls back to the iptables dataplane: the eBPF dataplane cannot run here", "reason", err)
			return openIPTables(ctx, log, cfg)
		}
		log.Info("auto selected the eBPF dataplane")
		return dp, nil
	case DataplaneIPTables:
		return openIPTables(ctx, log, cfg)
	}
	return nil, fmt.Errorf("unknown dataplane %q; use auto, ebpf, iptables or none", cfg.Dataplane)
}

func openIPTables(ctx context.Context, log hclog.Logger, cfg Config) (dataplane.Dataplane, error) {
	if cfg.SNATPortRange != "" {
		log.Warn("--snat-port-range applies to the eBPF dataplane only: the iptables dataplane masquerades with MASQUERADE, which keeps the client's port or picks one itself",
			"snat_port_range", cfg.SNATPortRange)
	}
	dp, err := iptables.New(ctx, log.Named("iptables"), iptables.Config{NetNS: cfg.NetNS, Mode: cmp.Or(cfg.IPTablesMode, iptables.ModeAuto), SetFlowSysctls: cfg.SetSysctls})
	if err != nil {
		return nil, fmt.Errorf("open iptables dataplane: %w", err)
	}
	log.Info("iptables dataplane ready", "mode", dp.Mode())
	return dp, nil
}

// ebpfConfig is the eBPF dataplane's configuration: EBPF, with NetNS and
// SNATPortRange's ports.
func (c Config) ebpfConfig() (ebpf.Config, error) {
	ecfg := c.EBPF
	ecfg.NetNS = c.NetNS
	ports, err := c.snatPorts()
	if err != nil {
		return ebpf.Config{}, err
	}
	if ports != (ebpf.PortRange{}) {
		ecfg.SNATPorts = ports
	}
	return ecfg, nil
}

func openEBPF(ctx context.Context, log hclog.Logger, cfg Config) (dataplane.Dataplane, error) {
	ecfg, err := cfg.ebpfConfig()
	if err != nil {
		return nil, err
	}
	dp, err := ebpf.New(ctx, log.Named("ebpf"), ecfg)
	if err != nil {
		return nil, fmt.Errorf("open ebpf dataplane: %w", err)
	}
	return dp, nil
}
