#!/usr/bin/env bash
# package-check.sh is CI's round trip of the Debian package: it builds it
# (make package), shows its control data and contents, installs it from
# the local file, runs both binaries, purges it, and checks that nothing
# of it is left: no files, and no vipd started by the maintainer scripts
# (which must start nothing without systemd as PID 1). Needs root, and
# refuses to run where a vipd package is installed already.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

if dpkg-query -W -f '${Status}' vipd 2>/dev/null | grep -q 'install ok'; then
	echo "package-check: a vipd package is installed here already; not touching it" >&2
	exit 1
fi
make package
debs=(bin/vipd_*_amd64.deb)
if ((${#debs[@]} != 1)); then
	echo "package-check: want one bin/vipd_*_amd64.deb, have: ${debs[*]}" >&2
	exit 1
fi
deb=${debs[0]}
dpkg-deb --info "$deb"
contents=$(dpkg-deb --contents "$deb")
echo "$contents"
paths=$(awk '{print $6}' <<<"$contents")
for want in ./usr/bin/vipd ./usr/bin/vipctl ./usr/lib/systemd/system/vipd.service ./etc/vipd/vipd.yaml ./etc/vipd/services.d/; do
	grep -qxF "$want" <<<"$paths" || { echo "package-check: $deb lacks $want" >&2; exit 1; }
done
rm -rf bin/pkg/control
dpkg-deb -e "$deb" bin/pkg/control
grep -qxF /etc/vipd/vipd.yaml bin/pkg/control/conffiles || { echo "package-check: /etc/vipd/vipd.yaml is not a conffile" >&2; exit 1; }

# vipd processes that run already (none in CI); any other after the
# install is one the package started.
purge() { apt-get purge -y -q vipd >/dev/null 2>&1 || true; }
trap purge EXIT
apt-get install -y -q --no-install-recommends "./$deb"
version=$(dpkg-deb --field "$deb" Version)
got=$(/usr/bin/vipd --version)
[[ $got == "$version" ]] || { echo "package-check: vipd --version says $got, the package $version" >&2; exit 1; }
got=$(/usr/bin/vipctl --version)
echo "vipd --version: $(/usr/bin/vipd --version); vipctl --version: $got"
[[ $got == *"$version"* ]] || { echo "package-check: vipctl --version does not say $version" >&2; exit 1; }
# The package must not start vipd: no process may run the installed
# binary. Tests elsewhere on the machine run vipd from other paths, so the
# check looks at each process's executable, not at every vipd.
packaged_vipds() {
	local pid
	for pid in $(pgrep -x vipd || true); do
		[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == /usr/bin/vipd* ]] && echo "$pid"
	done
	return 0
}
started=$(packaged_vipds | paste -sd,)
if [[ -n $started ]]; then
	echo "package-check: installing the package started vipd:" >&2
	ps -o pid,args -p "$started" >&2 || true
	exit 1
fi
apt-get purge -y -q vipd
trap - EXIT
for gone in /usr/bin/vipd /usr/bin/vipctl /usr/lib/systemd/system/vipd.service /etc/vipd /var/lib/vipd; do
	[[ ! -e $gone ]] || { echo "package-check: $gone is left after the purge" >&2; exit 1; }
done
[[ -z $(packaged_vipds) ]] || { echo "package-check: a vipd runs after the purge" >&2; exit 1; }
echo "package-check: $deb installs, runs --version and purges cleanly"
