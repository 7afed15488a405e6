package daemon

import (
	"fmt"
	"net/netip"
	"path"
)

// checkNodeNet refuses a --nodeport-addresses entry that is not a CIDR and
// an --external-interfaces glob that path.Match cannot use.
func (c Config) checkNodeNet() []error {
	var errs []error
	if _, err := c.nodePortPrefixes(); err != nil {
		errs = append(errs, err)
	}
	for _, g := range c.ExternalInterfaces {
		if g == "" {
			errs = append(errs, fmt.Errorf("--external-interfaces: an empty glob matches no interface"))
			continue
		}
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("--external-interfaces %q: %w", g, err))
		}
	}
	return errs
}

// nodePortPrefixes parses NodePortAddresses, masked.
func (c Config) nodePortPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.NodePortAddresses {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--nodeport-addresses %q: want a CIDR such as 198.18.0.0/16 or fd00::/64: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
