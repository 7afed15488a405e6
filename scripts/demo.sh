#!/usr/bin/env bash
# demo.sh runs a real vipd (with the fake dataplane for now) on a private
# socket and state directory, drives it with vipctl and grpcurl, and cleans up.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}

work=$(mktemp -d /tmp/vipd-demo.XXXXXX)
sock=$work/vipd.sock
vipd_pid=
cleanup() {
	[[ -n $vipd_pid ]] && kill "$vipd_pid" 2>/dev/null && wait "$vipd_pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }
vipctl() { "$BIN/vipctl" --socket "$sock" "$@"; }
grpcurl() { "$BIN/grpcurl" -plaintext -unix "$@"; }

step "start vipd (fake dataplane, state in $work/state)"
"$BIN/vipd" run --dataplane fake --socket "$sock" --state-dir "$work/state" >"$work/vipd.log" 2>&1 &
vipd_pid=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.05; done
grpcurl "$sock" grpc.health.v1.Health/Check

step "upsert two services with vipctl"
show vipctl apply -f examples/web.yaml

step "upsert a service with grpcurl (no proto files: reflection)"
printf '$ grpcurl -d ... vipd.v1.LoadBalancerService/UpsertService\n'
grpcurl -d '{"service": {"name": "default/dns", "vips": ["198.19.0.53"],
  "ports": [{"port": 53, "protocol": "PROTOCOL_UDP"}],
  "backends": [{"ip": "198.18.1.53"}, {"ip": "198.18.2.53"}]}}' \
	"$sock" vipd.v1.LoadBalancerService/UpsertService

step "list, get and status"
show vipctl service list
show vipctl service get default/web
show vipctl backends add default/api 198.18.1.22 --weight 3
show vipctl status

step "invalid input is refused field by field"
printf 'name: default/bad\nvips: [127.0.0.1]\nports: [{port: 0}]\n' >"$work/bad.yaml"
show vipctl apply -f "$work/bad.yaml" || echo "(exit code $?)"

step "the state survives kill -9 and a restart"
kill -9 "$vipd_pid"; wait "$vipd_pid" 2>/dev/null || true
"$BIN/vipd" run --dataplane fake --socket "$sock" --state-dir "$work/state" >>"$work/vipd.log" 2>&1 &
vipd_pid=$!
for _ in $(seq 100); do vipctl status >/dev/null 2>&1 && break; sleep 0.05; done
show vipctl service list
