// Package version reports the version of the running vipd build.
package version

import "runtime/debug"

// version is set at link time with -ldflags "-X github.com/vipd/vipd/internal/version.version=v1.2.3".
var version = ""

// String is the build's version: the link-time version if set, otherwise the
// module version or VCS revision recorded by the Go toolchain, otherwise "dev".
func String() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return "dev"
}
