package server

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/dataplane"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
	"github.com/vipd/vipd/server/validation"
)

// addressViolation turns err, when it is a *store.AddressConflictError,
// into an InvalidArgument violation of the request field that holds the
// address, which at names: at(true, ip) for a backend, at(false, ip) for
// a VIP. Other errors are returned as they are.
func addressViolation(err error, at func(backend bool, ip netip.Addr) string) error {
	var c *store.AddressConflictError
	if !errors.As(err, &c) {
		return err
	}
	holder := "service " + c.Holder
	if c.Holder == c.Service {
		holder = "this service"
	}
	desc := fmt.Sprintf("%s is a VIP of %s; a VIP that vipd serves cannot be a backend", c.Addr, holder)
	if !c.AsBackend {
		desc = fmt.Sprintf("%s is a backend of %s; a VIP that vipd serves cannot be a backend", c.Addr, holder)
	}
	return validation.Violations{{Field: at(c.AsBackend, c.Addr), Description: desc}}
}

// inRequest names the field of svc, named field in the request and as the
// request wrote it, that holds ip: field.backends[i].ip or field.vips[i].
func inRequest(field string, svc *vipdv1.Service) func(backend bool, ip netip.Addr) string {
	return func(backend bool, ip netip.Addr) string {
		if backend {
			return backendField(field+".backends", svc.GetBackends(), ip)
		}
		for i, s := range svc.GetVips() {
			if a, err := netip.ParseAddr(s); err == nil && a == ip {
				return fmt.Sprintf("%s.vips[%d]", field, i)
			}
		}
		return field + ".vips"
	}
}

// backendField names the entry of bs, a list named field in the request,
// whose ip is ip: field[i].ip, or field when none is.
func backendField(field string, bs []*vipdv1.Backend, ip netip.Addr) string {
	for i, b := range bs {
		if a, err := netip.ParseAddr(b.GetIp()); err == nil && a == ip {
			return fmt.Sprintf("%s[%d].ip", field, i)
		}
	}
	return field
}

// requestOrder returns, for backends that validation sorted, where each
// was in the request (orig, the same pointers in request order), or nil
// when the order did not change.
func requestOrder(orig, sorted []*vipdv1.Backend) []int32 {
	if slices.Equal(orig, sorted) {
		return nil
	}
	at := make(map[*vipdv1.Backend]int32, len(orig))
	for i, b := range orig {
		at[b] = int32(i)
	}
	order := make([]int32, len(sorted))
	for k, b := range sorted {
		order[k] = at[b]
	}
	return order
}

// inSyncRequest names the field of services[index] of a SyncServices that
// holds ip, from the service's dataplane form dp and its backends' request
// order (requestOrder).
func inSyncRequest(index int, dp *dataplane.Service, order []int32) func(backend bool, ip netip.Addr) string {
	return func(backend bool, ip netip.Addr) string {
		field := fmt.Sprintf("services[%d]", index)
		if backend {
			k := slices.IndexFunc(dp.Backends, func(b dataplane.Backend) bool { return b.IP == ip })
			switch {
			case k < 0:
				return field + ".backends"
			case order != nil:
				k = int(order[k])
			}
			return fmt.Sprintf("%s.backends[%d].ip", field, k)
		}
		if i := slices.Index(dp.VIPs, ip); i >= 0 {
			return fmt.Sprintf("%s.vips[%d]", field, i)
		}
		return field + ".vips"
	}
}
