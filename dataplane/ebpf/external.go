package ebpf

// The external half of the dataplane's state besides the frontends: the
// external interfaces (vipd_ext_ifaces, and the attachment of
// vipd_from_ext and vipd_to_ext) and the load-balancer source ranges
// (vipd_src_ranges).

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
)

// srcRangeKeyOf is the vipd_src_ranges key of one source range of the
// frontend revNat: the frontend's ID, then the range, IPv4 mapped into
// IPv6.
func srcRangeKeyOf(revNat uint32, p netip.Prefix) bpfSrcRangeKey {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	var k bpfSrcRangeKey
	k.Prefixlen = uint32(32 + bits)
	k.RevNatId = revNat
	k.Addr.W = toWords(p.Addr())
	return k
}

// srcRangeKeys are the vipd_src_ranges entries of a programmed frontend.
func srcRangeKeys(pr *programmed) []bpfSrcRangeKey {
	if pr == nil || pr.fe.flags&svcFlagSrcRanges == 0 {
		return nil
	}
	keys := make([]bpfSrcRangeKey, 0, len(pr.fe.srcRanges))
	for _, r := range pr.fe.srcRanges {
		keys = append(keys, srcRangeKeyOf(pr.revNat, r))
	}
	return keys
}

// syncSrcRanges makes vipd_src_ranges hold the source ranges of the
// frontends that changes touched, after apply wrote them; a full apply
// (full) also deletes every entry no frontend accounts for. A frontend
// whose master asks for source ranges drops every packet until its ranges
// are written, a moment later: the check fails closed.
func (d *Dataplane) syncSrcRanges(changes []change, full bool) error {
	m := d.objs.VipdSrcRanges
	want := map[bpfSrcRangeKey]bool{}
	var errs []error
	for _, c := range changes {
		keys := srcRangeKeys(d.prog.frontends[c.key])
		for _, k := range keys {
			want[k] = true
			if err := m.Put(&k, uint8(1)); err != nil {
				errs = append(errs, fmt.Errorf("write source range of %s: %w", c.key, mapErr(err)))
			}
		}
		for _, k := range d.srcRanges[c.key] {
			if !slices.Contains(keys, k) {
				if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = append(errs, fmt.Errorf("delete source range of %s: %w", c.key, err))
				}
			}
		}
		if len(keys) > 0 {
			d.srcRanges[c.key] = keys
		} else {
			delete(d.srcRanges, c.key)
		}
	}
	if full {
		for _, keys := range d.srcRanges {
			for _, k := range keys {
				want[k] = true
			}
		}
		var stale []bpfSrcRangeKey
		var k bpfSrcRangeKey
		var v uint8
		it := m.Iterate()
		for it.Next(&k, &v) {
			if !want[k] {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("read source ranges: %w", err))
		}
		for _, k := range stale {
			if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete stale source range: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// extIfaceOf is the vipd_ext_ifaces entry of an external interface: its
// first IPv4 and first IPv6 address, the addresses SNAT gives the clients
// of flows entering there.
func extIfaceOf(i *dataplane.Interface) bpfExtIface {
	var x bpfExtIface
	var have4, have6 bool
	for _, a := range i.Addrs {
		switch {
		case a.Is4() && !have4:
			x.Addr4.W, have4 = toWords(a), true
		case a.Is6() && !a.Is4In6() && !have6:
			x.Addr6.W, have6 = toWords(a), true
		}
	}
	return x
}

// syncExtIfaces makes vipd_ext_ifaces hold exactly node's external
// interfaces.
func (d *Dataplane) syncExtIfaces(node *dataplane.Node) error {
	m := d.objs.VipdExtIfaces
	want := map[uint32]bool{}
	var errs []error
	for i := range node.Interfaces {
		ifc := &node.Interfaces[i]
		if !ifc.External || ifc.Index <= 0 {
			continue
		}
		want[uint32(ifc.Index)] = true
		x := extIfaceOf(ifc)
		if err := m.Put(uint32(ifc.Index), &x); err != nil {
			errs = append(errs, fmt.Errorf("write external interface %s: %w", ifc.Name, mapErr(err)))
		}
	}
	var idx uint32
	var x bpfExtIface
	var stale []uint32
	it := m.Iterate()
	for it.Next(&idx, &x) {
		if !want[idx] {
			stale = append(stale, idx)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read external interfaces: %w", err))
	}
	for _, idx := range stale {
		if err := m.Delete(idx); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete external interface %d: %w", idx, err))
		}
	}
	return errors.Join(errs...)
}

// cloneNode copies a Node deep enough to compare later ones with.
func cloneNode(n *dataplane.Node) dataplane.Node {
	c := dataplane.Node{NodePortAddresses: slices.Clone(n.NodePortAddresses), Interfaces: slices.Clone(n.Interfaces)}
	for i := range c.Interfaces {
		c.Interfaces[i].Addrs = slices.Clone(c.Interfaces[i].Addrs)
	}
	return c
}

// warnSNATOverlap warns when the SNAT ports overlap the namespace's
// ip_local_port_range, from which the node's own connections take their
// source ports: the programs skip a port a local socket uses for the same
// peer, but a connection made later may still pick a port SNAT gave out,
// and lose its replies to the external flow. Reserve the range
// (net.ipv4.ip_local_reserved_ports) or move one of the two.
func warnSNATOverlap(log hclog.Logger, netnsPath string, snat PortRange) {
	var lo, hi int
	err := nsdo.Do(netnsPath, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return err
		}
		_, err = fmt.Sscanf(string(b), "%d %d", &lo, &hi)
		return err
	})
	if err != nil {
		log.Debug("cannot read ip_local_port_range", "error", err)
		return
	}
	if int(snat.Min) <= hi && lo <= int(snat.Max) {
		log.Warn("the SNAT ports of external traffic overlap ip_local_port_range: reserve them with net.ipv4.ip_local_reserved_ports, or move either range",
			"snat_ports", fmt.Sprintf("%d-%d", snat.Min, snat.Max), "ip_local_port_range", fmt.Sprintf("%d-%d", lo, hi))
	}
}
