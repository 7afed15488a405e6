package ebpf

// ExplainFlow: the dataplane.Explainer of the eBPF dataplane, which reads
// the maps the way the packet path's backend selection does.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/vipd/vipd/dataplane"
)

// ExplainFlow implements dataplane.Explainer for the packet path (pods'
// connections; node-local sockets are balanced per network namespace). It
// reads what select_backend in bpf/lb.h would: the frontend's session-
// affinity entry for the client's address, honoured while it is younger
// than the frontend's timeout and its backend may take new connections;
// else, for Maglev, the table slot of the flow's hash. A VIP that no
// frontend serves, or one without backends, explains nothing.
func (d *Dataplane) ExplainFlow(ctx context.Context, q dataplane.ExplainQuery) (dataplane.Explanation, error) {
	var ex dataplane.Explanation
	if err := ctx.Err(); err != nil {
		return ex, err
	}
	proto := protoNumber(q.Protocol)
	if proto == 0 {
		return ex, fmt.Errorf("explain: protocol %s: %w", q.Protocol, dataplane.ErrUnsupported)
	}
	client := netip.AddrPortFrom(q.Client.Addr().Unmap(), q.Client.Port())
	fe := feKey{addr: q.VIP.Addr().Unmap(), port: q.VIP.Port(), proto: proto}
	var svc bpfSvcVal
	if err := d.objs.VipdServices.Lookup(svcKeyOf(fe, 0), &svc); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return ex, nil
		}
		return ex, fmt.Errorf("explain %s: read service map: %w", fe, err)
	}
	if svc.Count == 0 {
		return ex, nil
	}
	if svc.Flags&svcFlagAffinity != 0 {
		k := bpfAffinityKey{RevNatId: svc.RevNatId}
		k.Client.W = toWords(client.Addr())
		var v bpfAffinityVal
		err := d.objs.VipdAffinity.Lookup(&k, &v)
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
		case err != nil:
			return ex, fmt.Errorf("explain %s: read affinity map: %w", fe, err)
		default:
			age := monotonicSeconds() - v.LastUsed
			eligible, err := d.eligible(svc.RevNatId, v.BackendId)
			if err != nil {
				return ex, fmt.Errorf("explain %s: %w", fe, err)
			}
			if age <= svc.AffinityTimeout && eligible {
				be, err := d.backendAddr(v.BackendId)
				if err != nil {
					return ex, fmt.Errorf("explain %s: %w", fe, err)
				}
				ex.AffinityBackend = be
				ex.AffinityRemaining = time.Duration(svc.AffinityTimeout-age) * time.Second
				ex.Pick = be
				return ex, nil
			}
		}
	}
	if svc.Flags&svcFlagMaglev != 0 && svc.MaglevSize > 0 {
		var table *ebpf.Map
		if err := d.objs.VipdMaglev.Lookup(svc.RevNatId, &table); err != nil {
			return ex, fmt.Errorf("explain %s: read Maglev table: %w", fe, err)
		}
		defer table.Close()
		slot := flowHash(client, netip.AddrPortFrom(fe.addr, fe.port), proto) % svc.MaglevSize
		var id uint32
		if err := table.Lookup(slot, &id); err != nil {
			return ex, fmt.Errorf("explain %s: read Maglev table slot %d: %w", fe, slot, err)
		}
		be, err := d.backendAddr(id)
		if err != nil {
			return ex, fmt.Errorf("explain %s: %w", fe, err)
		}
		ex.Pick = be
	}
	return ex, nil
}

// eligible reports whether backend id may take new connections of the
// frontend revNat.
func (d *Dataplane) eligible(revNat, id uint32) (bool, error) {
	var rn bpfRevNat
	if err := d.objs.VipdRevnat.Lookup(revNat, &rn); errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("read reverse-NAT map: %w", err)
	}
	if rn.Members != revNatMembersMap {
		// Inline, as member_flags of bpf/lb.h reads them.
		for j := range min(int(rn.Members), revNatInlineMembers) {
			if rn.MemberIds[j] == id {
				return rn.MemberFlags[j]&memberFlagEligible != 0, nil
			}
		}
		return false, nil
	}
	var flags uint32
	err := d.objs.VipdMembers.Lookup(bpfMemberKey{RevNatId: revNat, BackendId: id}, &flags)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read member map: %w", err)
	}
	return flags&memberFlagEligible != 0, nil
}

// backendAddr returns the address and port of backend id.
func (d *Dataplane) backendAddr(id uint32) (netip.AddrPort, error) {
	var b bpfBackend
	if err := d.objs.VipdBackends.Lookup(id, &b); err != nil {
		return netip.AddrPort{}, fmt.Errorf("read backend %d: %w", id, err)
	}
	if b.Used == 0 {
		return netip.AddrPort{}, fmt.Errorf("read backend %d: %w", id, ebpf.ErrKeyNotExist)
	}
	return netip.AddrPortFrom(fromWords(b.Addr.W), fromBE16(b.Port)), nil
}
