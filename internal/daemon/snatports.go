package daemon

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vipd/vipd/dataplane/ebpf"
)

// snatPorts parses SNATPortRange ("MIN-MAX", inclusive), the source ports
// the eBPF dataplane's masquerade hands out (ebpf.Config.SNATPorts). Empty
// gives the zero range: the dataplane's default.
func (c Config) snatPorts() (ebpf.PortRange, error) {
	if c.SNATPortRange == "" {
		return ebpf.PortRange{}, nil
	}
	lo, hi, ok := strings.Cut(c.SNATPortRange, "-")
	min, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	max, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if !ok || err1 != nil || err2 != nil || min == 0 || min > max {
		return ebpf.PortRange{}, fmt.Errorf("--snat-port-range %q: want MIN-MAX with 1 <= MIN <= MAX <= 65535, such as 61000-65535", c.SNATPortRange)
	}
	return ebpf.PortRange{Min: uint16(min), Max: uint16(max)}, nil
}
