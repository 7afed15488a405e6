#!/usr/bin/env bash
# build.sh builds the test control plane (etcd, kube-apiserver,
# kube-controller-manager) from this module into a directory keyed by the
# module's content, and prints that directory. A second run with the same
# go.mod, go.sum and cmd/ sources only prints it. The binaries live beside the
# Go build cache (not in the repository) so that CI's fresh clones reuse them.
#
# Usage: test/kube/build.sh [OUTROOT]   (default: $(go env GOCACHE)/../vipd-kube-bin)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
GO=${GO:-go}
outroot=${1:-$(dirname "$($GO env GOCACHE)")/vipd-kube-bin}

# The Kubernetes release the binaries report on /version; it must match the
# k8s.io/kubernetes version in go.mod.
kube_version=$($GO list -m -f '{{.Version}}' k8s.io/kubernetes)
key=$(cat go.mod go.sum $(find cmd -name '*.go' | sort) build.sh | sha256sum | cut -c1-16)
out="$outroot/$key"
if [[ -x "$out/kube-apiserver" && -x "$out/kube-controller-manager" && -x "$out/etcd" ]]; then
	touch "$out"
	echo "$out"
	exit 0
fi
mkdir -p "$out.tmp"
major=${kube_version#v}; major=${major%%.*}
minor=${kube_version#v*.}; minor=${minor%%.*}
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=0000000000000000000000000000000000000000"
	ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# One build at a time keeps the peak memory near 2 GB on a 2-core machine.
$GO build -trimpath -o "$out.tmp/etcd" ./cmd/etcd >&2
$GO build -trimpath -ldflags "$ldflags" -o "$out.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
$GO build -trimpath -ldflags "$ldflags" -o "$out.tmp/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager >&2
rm -rf "$out"
mv "$out.tmp" "$out"
# Builds of other module versions (about 300 MB each) go once unused for a week.
find "$outroot" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +7 -exec rm -rf {} +
echo "$out"
