// Package nodecheck checks the node prerequisites that vipd's rules rely on
// but do not program: IP forwarding, a route that covers each VIP, and the
// conntrack sysctls the iptables flow source reads. It reads them in the
// network namespace vipd programs, keeps the unmet ones as warnings for
// GetStatus, and logs each warning when it appears and when it clears.
//
// It changes nothing in the kernel unless told to set sysctls
// (Config.SetSysctls), and then only the sysctls it checks, in that
// namespace. It knows nothing of gRPC or of the dataplanes: the daemon says
// what applies (Needs) and turns the warnings into API messages.
package nodecheck
