package validation

import "net/netip"

// reservedIPv4 is 240.0.0.0/4, "reserved for future use" (RFC 1112), with
// the limited broadcast address 255.255.255.255 at its top: no host can
// have such an address, and Linux does not route to one.
var reservedIPv4 = netip.MustParsePrefix("240.0.0.0/4")

// checkBackendIP adds a violation, named field, if ip, an address that
// unicast accepted, still cannot be a backend's. unicast already refuses
// what no VIP or backend may be: the unspecified, loopback, multicast
// (link-local multicast among it) and link-local addresses, and any
// IPv4-mapped IPv6 form, which would otherwise smuggle the IPv4 ones in.
// Whether ip is a VIP that vipd serves is the store's check, made in the
// write's transaction.
func checkBackendIP(v *Violations, ip netip.Addr, field string) {
	if reservedIPv4.Contains(ip) {
		v.add(field, "%s is in 240.0.0.0/4, which is reserved: no host can have it", ip)
	}
}
