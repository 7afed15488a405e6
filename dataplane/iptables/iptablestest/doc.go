// Package iptablestest is a test-only model of the kernel's iptables for
// the tests of package iptables and its users: a Tracer that applies
// iptables-restore --noflush input, as Payload renders it, to in-memory
// chains and follows packets through them, reporting where they would go.
//
// It runs no iptables binary and needs no root. Product code must not
// import it.
package iptablestest
