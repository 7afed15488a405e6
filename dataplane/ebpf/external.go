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
	keys := make([]bpfSrcRangeKey, 0, len(pr.fe.ranges()))
	for _, r := range pr.fe.ranges() {
		keys = append(keys, srcRangeKeyOf(pr.revNat, r))
	}
	return keys
}

// preSrcRanges writes, before apply, the source ranges of the changed
// frontends that have a reverse-NAT ID already, so that a frontend's new
// ranges are in place before its master entry changes (make before
// break); the ranges they lose go after apply, in syncSrcRanges. A new
// frontend gets its ID in apply: its ranges follow its master entry a
// moment later, and until then its packets are dropped (fail closed).
func (d *Dataplane) preSrcRanges(changes []change) error {
	var errs []error
	for _, c := range changes {
		id, ok := d.prog.revNatOf(c.key)
		if !ok || c.fe == nil || c.fe.flags&svcFlagSrcRanges == 0 {
			continue
		}
		for _, r := range c.fe.ranges() {
			k := srcRangeKeyOf(id, r)
			if err := d.objs.VipdSrcRanges.Put(&k, uint8(1)); err != nil {
				errs = append(errs, fmt.Errorf("write source range of %s: %w", c.key, mapErr(err)))
			}
		}
	}
	return errors.Join(errs...)
}

// syncSrcRanges makes vipd_src_ranges hold the source ranges of the
// frontends that changes touched, after apply wrote them; a full apply
// (full) also deletes every entry no frontend accounts for.
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

// snatSkip is the part of snat that SNAT must skip: the namespace's
// ip_local_port_range, from which the node's own connections take their
// source ports (a connection made later could pick a port SNAT gave out
// and lose its replies to the external flow). Zero: none to skip. It fails
// when the skip would leave no port. The range is read once: a change of
// ip_local_port_range takes effect when vipd restarts.
func snatSkip(log hclog.Logger, netnsPath string, snat PortRange) (PortRange, error) {
	local, err := localPortRange(netnsPath)
	if err != nil {
		log.Warn("cannot read ip_local_port_range: SNAT skips Linux's default", "error", err,
			"ip_local_port_range", fmt.Sprintf("%d-%d", defaultLocalPorts.Min, defaultLocalPorts.Max))
		local = defaultLocalPorts
	}
	skip, err := snatSkipOf(snat, local)
	if err != nil {
		return PortRange{}, err
	}
	if skip == (PortRange{}) {
		return skip, nil
	}
	log.Debug("SNAT skips ip_local_port_range", "snat_ports", fmt.Sprintf("%d-%d", snat.Min, snat.Max),
		"skipped", fmt.Sprintf("%d-%d", skip.Min, skip.Max))
	return skip, nil
}

// snatSkipOf is the part of snat inside local (zero: none), and an error
// when that is all of snat.
func snatSkipOf(snat, local PortRange) (PortRange, error) {
	skip := PortRange{Min: max(snat.Min, local.Min), Max: min(snat.Max, local.Max)}
	if skip.Min > skip.Max {
		return PortRange{}, nil
	}
	if skip == snat {
		return PortRange{}, fmt.Errorf("SNAT port range %d-%d lies within ip_local_port_range %d-%d: no port left for SNAT",
			snat.Min, snat.Max, local.Min, local.Max)
	}
	return skip, nil
}

// localPortRange reads ip_local_port_range in the namespace at netnsPath.
func localPortRange(netnsPath string) (PortRange, error) {
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
		return PortRange{}, fmt.Errorf("read ip_local_port_range: %w", err)
	}
	if lo < 1 || hi > 65535 || lo > hi {
		return PortRange{}, fmt.Errorf("ip_local_port_range %d-%d: not a port range", lo, hi)
	}
	return PortRange{Min: uint16(lo), Max: uint16(hi)}, nil
}

// checkExternalMaps compares vipd_ext_ifaces and vipd_src_ranges with
// what the last Apply wrote, and returns a driftMapEntries drift for each
// that differs (a full Apply rewrites both). They are small: read whole
// on every check. The caller holds the apply lock.
func (d *Dataplane) checkExternalMaps() ([]dataplane.Drift, error) {
	var drifts []dataplane.Drift
	report := func(name string, missing, wrong, extra int) {
		if missing+wrong+extra > 0 {
			drifts = append(drifts, dataplane.Drift{What: driftMapEntries, Detail: fmt.Sprintf(
				"%s: %d entries missing, %d wrong, %d no interface or service accounts for", name, missing, wrong, extra)})
		}
	}

	wantIf := map[uint32]bpfExtIface{}
	for i := range d.node.Interfaces {
		if ifc := &d.node.Interfaces[i]; ifc.External && ifc.Index > 0 {
			wantIf[uint32(ifc.Index)] = extIfaceOf(ifc)
		}
	}
	missing, wrong, extra := 0, 0, 0
	seen := map[uint32]bool{}
	err := forEach(d.objs.VipdExtIfaces, func(idx uint32, x bpfExtIface) {
		seen[idx] = true
		w, ok := wantIf[idx]
		switch {
		case !ok:
			extra++
		case w != x:
			wrong++
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read external interfaces: %w", err)
	}
	for idx := range wantIf {
		if !seen[idx] {
			missing++
		}
	}
	report(bpfMapVipdExtIfaces, missing, wrong, extra)

	wantR := map[bpfSrcRangeKey]bool{}
	for _, keys := range d.srcRanges {
		for _, k := range keys {
			wantR[k] = true
		}
	}
	missing, extra = 0, 0
	seenR := map[bpfSrcRangeKey]bool{}
	var k bpfSrcRangeKey
	var v uint8
	it := d.objs.VipdSrcRanges.Iterate()
	for it.Next(&k, &v) {
		seenR[k] = true
		if !wantR[k] {
			extra++
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read source ranges: %w", err)
	}
	for k := range wantR {
		if !seenR[k] {
			missing++
		}
	}
	report(bpfMapVipdSrcRanges, missing, 0, extra)
	return drifts, nil
}

// vipd_snat_stats slots (SNAT_STAT_* of bpf/maps.h).
const (
	snatStatExhausted = 0
	snatStatTWSkips   = 1
)

// SNATCounters reads the SNAT counters of the programs (vipd_snat_stats,
// summed over CPUs), counted since the map was created: exhausted is the
// new external flows under policy Cluster that were dropped because SNAT
// found no port for them in SNAT_TRIES tries; timeWaitSkips is the ports
// it passed over for a new TCP flow because the backend's TIME_WAIT of
// that backend-side tuple would have refused the flow's SYN
// (vipd_snat_tw). internal/metrics exports them.
func (d *Dataplane) SNATCounters() (exhausted, timeWaitSkips uint64, err error) {
	if exhausted, err = sumPerCPU(d.objs.VipdSnatStats, snatStatExhausted); err != nil {
		return 0, 0, fmt.Errorf("read SNAT port exhaustion counter: %w", err)
	}
	if timeWaitSkips, err = sumPerCPU(d.objs.VipdSnatStats, snatStatTWSkips); err != nil {
		return 0, 0, fmt.Errorf("read SNAT TIME_WAIT skip counter: %w", err)
	}
	return exhausted, timeWaitSkips, nil
}

// sumPerCPU is slot i of the per-CPU array m, summed over CPUs.
func sumPerCPU(m *ebpf.Map, i uint32) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(i, &perCPU); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n, nil
}
