package statelessdnat

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/vipd/vipd/internal/nsdo"
)

// maxBackends is the size of the program's backend array (MAX_BACKENDS).
const maxBackends = 16

// Config is what the programs translate.
type Config struct {
	// VIP is the service address and port that clients connect to.
	VIP netip.AddrPort
	// Backends are the backends' IPv4 addresses, and TargetPort the port
	// they serve on.
	Backends   []netip.Addr
	TargetPort uint16
	// ReplyPortLo and ReplyPortHi bound the client ports whose replies
	// are translated back: the one thing that tells, without state, a
	// reply of a VIP connection from a reply of a direct one.
	ReplyPortLo, ReplyPortHi uint16
}

// DNAT is the program pair, loaded and attached to one interface.
type DNAT struct {
	objs  dnatObjects
	links []link.Link
}

// Attach loads the programs for c and attaches them, with tcx links, to
// the ingress and egress of the interface ifname in the network namespace
// at nsPath (the client pod's host-side veth). It is all-or-nothing: on
// error nothing stays loaded or attached. Close detaches them.
func Attach(nsPath, ifname string, c Config) (_ *DNAT, err error) {
	if !c.VIP.Addr().Is4() || len(c.Backends) == 0 || len(c.Backends) > maxBackends {
		return nil, fmt.Errorf("stateless DNAT: want an IPv4 VIP and 1 to %d backends, have %s and %d", maxBackends, c.VIP, len(c.Backends))
	}
	spec, err := loadDnat()
	if err != nil {
		return nil, fmt.Errorf("stateless DNAT: %w", err)
	}
	var backends [maxBackends]uint32
	for i, b := range c.Backends {
		if !b.Is4() {
			return nil, fmt.Errorf("stateless DNAT: backend %s is not IPv4", b)
		}
		backends[i] = be32(b)
	}
	vars := []struct {
		name string
		v    any
	}{
		{"vip", be32(c.VIP.Addr())}, {"vport", be16(c.VIP.Port())}, {"target_port", be16(c.TargetPort)},
		{"backend_count", uint32(len(c.Backends))}, {"backends", backends},
		{"rev_port_lo", c.ReplyPortLo}, {"rev_port_hi", c.ReplyPortHi},
	}
	for _, v := range vars {
		if err := spec.Variables[v.name].Set(v.v); err != nil {
			return nil, fmt.Errorf("stateless DNAT: set %s: %w", v.name, err)
		}
	}
	d := &DNAT{}
	if err := spec.LoadAndAssign(&d.objs, nil); err != nil {
		return nil, fmt.Errorf("stateless DNAT: load: %w", err)
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	err = nsdo.Do(nsPath, func() error {
		iface, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		for _, a := range []struct {
			prog   *ebpf.Program
			attach ebpf.AttachType
		}{{d.objs.DnatFromClient, ebpf.AttachTCXIngress}, {d.objs.DnatToClient, ebpf.AttachTCXEgress}} {
			l, err := link.AttachTCX(link.TCXOptions{Interface: iface.Index, Program: a.prog, Attach: a.attach})
			if err != nil {
				return fmt.Errorf("attach to %s: %w", ifname, err)
			}
			d.links = append(d.links, l)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stateless DNAT: %w", err)
	}
	return d, nil
}

// Programs returns the two programs, for their run-time statistics.
func (d *DNAT) Programs() []*ebpf.Program {
	return []*ebpf.Program{d.objs.DnatFromClient, d.objs.DnatToClient}
}

// Close detaches and unloads the programs.
func (d *DNAT) Close() error {
	var errs []error
	for _, l := range d.links {
		errs = append(errs, l.Close())
	}
	d.links = nil
	errs = append(errs, d.objs.Close())
	return errors.Join(errs...)
}

// be32 is a's bytes as the program reads them from a packet: in network
// order, loaded as a native (little-endian) integer.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// be16 is port p in network order, loaded as a native integer.
func be16(p uint16) uint16 { return p>>8 | p<<8 }
