package client

import "os"

// DefaultSocket is the Unix socket vipd serves its API on unless its
// --socket flag says otherwise, and so the target that vipctl and
// vipd-k8s use by default.
const DefaultSocket = "/run/vipd/vipd.sock"

// SocketEnv names the environment variable that, when set and not empty,
// replaces DefaultSocket as the default target of vipctl and vipd-k8s.
// vipd's own --socket reads it too, as VIPD_<FLAG> sets each of its flags.
const SocketEnv = "VIPD_SOCKET"

// SocketFromEnv returns the value of SocketEnv, or DefaultSocket when it is
// unset or empty. It is meant for a flag's default; it does not check that
// the path exists.
func SocketFromEnv() string {
	if v := os.Getenv(SocketEnv); v != "" {
		return v
	}
	return DefaultSocket
}
