#!/usr/bin/env bash
# pkg-version.sh prints the Debian version of the package built from this
# tree: the last v* tag without its v (1.2.3, or 1.2.3+git.5.abc1234 past
# it), else 0.0.0~git<commit time>.<commit>, which sorts by commit time.
set -euo pipefail
cd "$(dirname "$0")/.."
if tag=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
	v=${tag#v}
	# v1.2.3-5-gabc1234 → 1.2.3+git.5.abc1234
	if [[ $v =~ ^(.*)-([0-9]+)-g([0-9a-f]+)$ ]]; then
		v="${BASH_REMATCH[1]}+git.${BASH_REMATCH[2]}.${BASH_REMATCH[3]}"
	fi
	echo "${v//-/\~}"
	exit 0
fi
echo "0.0.0~git$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(git rev-parse --short=7 HEAD)"
