package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/nodenet"
	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// maxKernelDiffs bounds the differences CheckKernel lists one by one.
const maxKernelDiffs = 20

// DesiredState turns services as ListServices returns them into the State
// vipd hands its dataplane, through the same validation vipd applies.
func DesiredState(svcs []*vipdv1.Service) (*dataplane.State, error) {
	s := &dataplane.State{Services: make(map[string]*dataplane.Service, len(svcs))}
	for _, svc := range svcs {
		// Stored services are read without limits, as vipd reads its state.
		_, dp, v := validation.Service(svc, validation.Limits{MaxPorts: -1}, "service")
		if len(v) > 0 {
			return nil, fmt.Errorf("listed service %s does not validate: %w", svc.GetName(), v)
		}
		s.Services[dp.Name] = dp
	}
	return s, nil
}

// CheckKernel compares what the kernel of the node namespace holds with
// vipd's desired state, as ListServices returns it, and returns nil when
// they match. For iptables, the vipd chains of iptables-save (nft) in both
// families must be exactly what the dataplane's renderer makes of the
// state, and the hook rules must be in place; for eBPF, the pinned maps
// under bpffs must pass ebpf.VerifyPinned. vipd must not be applying
// changes meanwhile.
func CheckKernel(ctx context.Context, api *client.Client, dp string, node *netlab.NS, bpffs string) error {
	svcs, err := api.ListServices(ctx, "")
	if err != nil {
		return fmt.Errorf("check kernel: ListServices: %w", err)
	}
	s, err := DesiredState(svcs)
	if err != nil {
		return fmt.Errorf("check kernel: %w", err)
	}
	// vipd follows node's network with its defaults (no
	// --nodeport-addresses or --external-interfaces): the Node it applies
	// is what a read of that namespace gives.
	if s.Node, err = nodenet.Read(nodenet.Config{NetNS: node.Path()}); err != nil {
		return fmt.Errorf("check kernel: read the node's network: %w", err)
	}
	switch dp {
	case "iptables":
		return checkIptables(ctx, node, s)
	case "ebpf":
		return ebpf.VerifyPinned(bpffs, s, maglev.DefaultTableSize)
	}
	return fmt.Errorf("check kernel: unknown dataplane %q", dp)
}

// checkIptables compares the vipd chains in node's nft tables with the
// rendering of s.
func checkIptables(ctx context.Context, node *netlab.NS, s *dataplane.State) error {
	want, err := iptables.Render(s, iptables.Options{}, nil)
	if err != nil {
		return fmt.Errorf("check kernel: render: %w", err)
	}
	saves := map[iptables.Family][]byte{}
	for f, tool := range map[iptables.Family]string{iptables.IPv4: "iptables-nft-save", iptables.IPv6: "ip6tables-nft-save"} {
		var stdout, stderr bytes.Buffer
		cmd := node.Command(ctx, tool)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("check kernel: %s: %w: %s", tool, err, stderr.String())
		}
		saves[f] = stdout.Bytes()
	}
	got := iptables.RulesetFromSave(saves)
	var diffs []string
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, t := range []iptables.Table{iptables.NAT, iptables.Filter} {
			wantChains, gotChains := want.Chains(f, t), got.Chains(f, t)
			for _, c := range wantChains {
				if !slices.Contains(gotChains, c) {
					diffs = append(diffs, fmt.Sprintf("%s %s: chain %s missing", f, t, c))
					continue
				}
				if w, g := want.Rules(f, t, c), got.Rules(f, t, c); !slices.Equal(w, g) {
					diffs = append(diffs, fmt.Sprintf("%s %s: chain %s has rules\n    %s\n  want\n    %s",
						f, t, c, strings.Join(g, "\n    "), strings.Join(w, "\n    ")))
				}
			}
			for _, c := range gotChains {
				if !slices.Contains(wantChains, c) {
					diffs = append(diffs, fmt.Sprintf("%s %s: stale chain %s (%d rules)", f, t, c, len(got.Rules(f, t, c))))
				}
			}
		}
		for _, h := range iptables.Hooks(f) {
			jump := "-j " + h.Args[len(h.Args)-1]
			if !hasRule(saves[f], string(h.Table), h.Chain, jump) {
				diffs = append(diffs, fmt.Sprintf("%s %s: hook %s ... %s missing", f, h.Table, h.Chain, jump))
			}
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	n := len(diffs)
	if n > maxKernelDiffs {
		diffs = append(diffs[:maxKernelDiffs], fmt.Sprintf("... and %d more", n-maxKernelDiffs))
	}
	return errors.New("iptables rules differ from the desired state of " + fmt.Sprint(s.Len()) + " services:\n  " + strings.Join(diffs, "\n  "))
}

// hasRule reports whether save has, in table, a rule of chain ending in suffix.
func hasRule(save []byte, table, chain, suffix string) bool {
	in := false
	for line := range strings.Lines(string(save)) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "*") {
			in = line[1:] == table
			continue
		}
		if in && strings.HasPrefix(line, "-A "+chain+" ") && strings.HasSuffix(line, suffix) {
			return true
		}
	}
	return false
}
