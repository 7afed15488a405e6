#!/usr/bin/env bash
# install-deps.sh installs the Debian packages that vipd's tests and demo need,
# and only those that are missing. It needs root when something is missing.
#
#   install-deps.sh            what make test and make demo need
#   install-deps.sh generate   also what make generate needs (clang for bpf2go)
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip || need+=(iproute2)
have nsenter || need+=(util-linux)
{ have iptables-nft-restore && have iptables-legacy-restore; } || need+=(iptables)
have conntrack || need+=(conntrack)
# systemd-analyze verifies deploy/systemd/vipd.service (cmd/vipd's tests).
have systemd-analyze || need+=(systemd)
# gcc builds bench/load's C cross-check generator (bench/load's tests, make bench).
have gcc || need+=(gcc)
[[ -f /usr/include/stdio.h ]] || need+=(libc6-dev)
if [[ ${1:-} == generate ]]; then
	have clang || need+=(clang)
	have llvm-strip || need+=(llvm)
	[[ -f /usr/include/bpf/bpf_helpers.h ]] || need+=(libbpf-dev)
	[[ -f /usr/include/linux/bpf.h ]] || need+=(linux-libc-dev)
fi

if ((${#need[@]} == 0)); then
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "install-deps: missing packages: ${need[*]}; install them or run as root" >&2
	exit 1
fi
echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
