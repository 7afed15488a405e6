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
// address, which at names from the address's role in the request's
// service. Other errors are returned as they are.
func addressViolation(err error, at func(role store.AddrRole, ip netip.Addr) string) error {
	var c *store.AddressConflictError
	if !errors.As(err, &c) {
		return err
	}
	holder := "service " + c.Holder
	if c.Holder == c.Service {
		holder = "this service"
	}
	desc := fmt.Sprintf("%s is %s %s of %s; %s", c.Addr, article(c.HolderRole), c.HolderRole, holder, c.Rule())
	return validation.Violations{{Field: at(c.Role, c.Addr), Description: desc}}
}

// article is the indefinite article of role's name.
func article(role store.AddrRole) string {
	if role == store.RoleExternalIP {
		return "an"
	}
	return "a"
}

// inRequest names the field of svc, named field in the request and as the
// request wrote it, that holds ip in role: field.backends[i].ip,
// field.vips[i], field.external_ips[i] or field.load_balancer_ips[i].
func inRequest(field string, svc *vipdv1.Service) func(role store.AddrRole, ip netip.Addr) string {
	return func(role store.AddrRole, ip netip.Addr) string {
		list, name := svc.GetVips(), "vips"
		switch role {
		case store.RoleBackend:
			return backendField(field+".backends", svc.GetBackends(), ip)
		case store.RoleExternalIP:
			list, name = svc.GetExternalIps(), "external_ips"
		case store.RoleLoadBalancerIP:
			list, name = svc.GetLoadBalancerIps(), "load_balancer_ips"
		}
		for i, s := range list {
			if a, err := netip.ParseAddr(s); err == nil && a == ip {
				return fmt.Sprintf("%s.%s[%d]", field, name, i)
			}
		}
		return field + "." + name
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
// holds ip in role, from the service's dataplane form dp and its backends'
// request order (requestOrder). The conversion keeps the order of the
// VIPs and of the external and load-balancer IPs.
func inSyncRequest(index int, dp *dataplane.Service, order []int32) func(role store.AddrRole, ip netip.Addr) string {
	return func(role store.AddrRole, ip netip.Addr) string {
		field := fmt.Sprintf("services[%d]", index)
		list, name := dp.VIPs, "vips"
		switch role {
		case store.RoleBackend:
			k := slices.IndexFunc(dp.Backends, func(b dataplane.Backend) bool { return b.IP == ip })
			switch {
			case k < 0:
				return field + ".backends"
			case order != nil:
				k = int(order[k])
			}
			return fmt.Sprintf("%s.backends[%d].ip", field, k)
		case store.RoleExternalIP:
			list, name = dp.ExternalIPs, "external_ips"
		case store.RoleLoadBalancerIP:
			list, name = dp.LoadBalancerIPs, "load_balancer_ips"
		}
		if i := slices.Index(list, ip); i >= 0 {
			return fmt.Sprintf("%s.%s[%d]", field, name, i)
		}
		return field + "." + name
	}
}

// unsupportedField names, after "services[i]", the field of dp that holds
// the first setting caps cannot honour, in the order of
// dataplane.Capabilities.Check: ".load_balancing", ".ports[j].protocol",
// or the first field of the external part (".ports[j].node_port",
// ".external_ips[0]", ".load_balancer_ips[0]"); "" when caps honour all.
// The conversion keeps the order of the ports and of the external and
// load-balancer IPs, so the indexes are the request's.
func unsupportedField(dp *dataplane.Service, caps dataplane.Capabilities) string {
	if !slices.Contains(caps.LoadBalancing, dp.LoadBalancing) {
		return ".load_balancing"
	}
	for j, p := range dp.Ports {
		if !slices.Contains(caps.Protocols, p.Protocol) {
			return fmt.Sprintf(".ports[%d].protocol", j)
		}
	}
	if caps.External {
		return ""
	}
	for j, p := range dp.Ports {
		if p.NodePort != 0 {
			return fmt.Sprintf(".ports[%d].node_port", j)
		}
	}
	switch {
	case len(dp.ExternalIPs) > 0:
		return ".external_ips[0]"
	case len(dp.LoadBalancerIPs) > 0:
		return ".load_balancer_ips[0]"
	}
	return ""
}
