#!/bin/bash
# gen.sh BIN OUT [kill9|sigterm] writes a state dir with the vipd and vipctl
# in BIN (built from an old commit: git worktree add /tmp/old REV &&
# cd /tmp/old && go build -o BIN/ ./cmd/vipd ./cmd/vipctl) into OUT, by
# the same calls for every version: apply services.yaml, add one backend,
# remove one, delete a service, then stop vipd.
set -euo pipefail
bin=$1 out=$2 mode=${3:-kill9}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
extra=()
if "$bin/vipd" run --help 2>&1 | grep -q -- --metrics-addr; then extra+=(--metrics-addr ''); fi
"$bin/vipd" run --dataplane fake --state-dir "$work/state" --socket "$work/sock" "${extra[@]}" >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S "$work/sock" ] && break; sleep 0.1; done
c() { "$bin/vipctl" --socket "$work/sock" "$@"; }
c apply -f "$here/services.yaml"
c backends add default/web 198.18.1.12 --weight 3
c backends remove default/web 198.18.2.10
c service delete default/gone
if [ "$mode" = kill9 ]; then kill -9 $pid; else kill -TERM $pid; fi
wait $pid || true
mkdir -p "$out"
for f in state journal; do [ -f "$work/state/$f" ] && cp "$work/state/$f" "$out/"; done
ls -l "$out"
