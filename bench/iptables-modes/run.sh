#!/usr/bin/env bash
# Rerun the whole vipd iptables-mode benchmark with one command:
#   bench/iptables-modes/run.sh [--install] [--quick] [--only env,features,full,partial,diag,extra] [--out DIR]
# Root only. All iptables work happens in network namespaces named
# vipdmeas-<pid>-<k> that bench.py deletes on exit, error or SIGINT/SIGTERM/SIGHUP
# (it also kills the iptables child it is waiting for); it snapshots the root
# namespace's iptables-nft/-legacy/nft rules before and after and reports any
# difference. The root namespace's rules, routes and links are never touched.
# ~45 min on 2 cores. Results: results/results-<UTC stamp>.json, results/latest.json,
# results/latest-tables.md. Env knobs: STEP_TIMEOUT (300 s), REPS (5), REPS_BIG (3).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }

args=()
for a in "$@"; do
  if [ "$a" = --install ]; then
    apt-get update -qq && apt-get install -y -qq iptables conntrack nftables strace ltrace >/dev/null
  else
    args+=("$a")
  fi
done
for b in iptables-nft-restore iptables-legacy-restore ip python3 strace; do
  command -v "$b" >/dev/null || { echo "missing $b (try: $0 --install)" >&2; exit 1; }
done
# exec: signals go straight to bench.py, which owns all cleanup.
exec python3 "$HERE/bench.py" ${args[@]+"${args[@]}"}
