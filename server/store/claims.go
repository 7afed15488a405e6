package store

// Holder returns the name of the service that holds claim c: the service
// that forwards c.VIP, c.Port and c.Protocol. c.VIP must be in its
// canonical (unmapped) form, as services store it.
func (s *Snapshot) Holder(c Claim) (string, bool) {
	return s.claims.Get(c)
}
