// Package sockdiag destroys node-local UDP sockets that are stuck on a
// removed backend, through the kernel's sock_diag netlink interface
// (SOCK_DESTROY, as `ss -K` and Cilium do).
//
// vipd's cgroup connect hooks connect a UDP socket that connect()s to a
// service VIP straight to one backend. When that backend leaves the service,
// the socket would keep sending to it; destroying it makes the application
// see ECONNABORTED and reconnect, which picks a live backend.
//
// The package only ever destroys a socket that matches both the caller's
// cookies and destinations: every SOCK_DESTROY request carries the socket's
// cookie, so the kernel refuses it if the 4-tuple now belongs to another
// socket. It never changes namespace, link or address configuration, and it
// works in the network namespace it is given, never implicitly in another.
package sockdiag
