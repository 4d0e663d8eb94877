#!/usr/bin/env bash
# Three "hosts" on one machine: network namespaces kvant_rt (router,
# 10.78.0.1), kvant_pf (prefill server, 10.78.0.2) and kvant_dc (decode
# server, 10.78.0.3), each joined by a veth pair to a bridge in a fourth
# namespace (kvant_hub), so that traffic between them crosses real
# interfaces and never leaves the namespaces. A greedy completion through
# the router must equal one colocated server's (on loopback, outside the
# namespaces) with the same split of weights. Everything is removed on exit,
# whatever happens. Exits 77 (a skip for ctest) with a message where
# namespaces cannot be made (no root, no iproute2, a container without the
# rights).
# Usage: tests/disagg/three_hosts.sh KVANT MODEL
set -u
kvant=$1 model=$2
R=kvant_rt P=kvant_pf D=kvant_dc H=kvant_hub
if ! command -v ip >/dev/null 2>&1; then echo "three_hosts: no ip (iproute2): skipped"; exit 77; fi
pids=()
tmp=$(mktemp -d)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  for ns in "$R" "$P" "$D" "$H"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$tmp"
}
for ns in "$R" "$P" "$D" "$H"; do ip netns del "$ns" 2>/dev/null; done  # left by a killed run
trap cleanup EXIT
for ns in "$H" "$R" "$P" "$D"; do
  if ! ip netns add "$ns" 2>/dev/null; then
    echo "three_hosts: cannot create network namespaces here (needs root and CAP_SYS_ADMIN): skipped"
    exit 77
  fi
done
set -e
ip -n "$H" link add kvant_br type bridge
ip -n "$H" link set kvant_br up
i=1
for ns in "$R" "$P" "$D"; do
  ip link add "kvant_h$i" type veth peer name "kvant_e$i"
  ip link set "kvant_h$i" netns "$H"
  ip link set "kvant_e$i" netns "$ns"
  ip -n "$H" link set "kvant_h$i" master kvant_br
  ip -n "$H" link set "kvant_h$i" up
  ip -n "$ns" addr add "10.78.0.$i/24" dev "kvant_e$i"
  ip -n "$ns" link set "kvant_e$i" up
  ip -n "$ns" link set lo up
  i=$((i + 1))
done
set +e

# Waits for "on http://...:PORT/v1" in a log (a process that exits fails).
wait_up() {
  for _ in $(seq 1 600); do
    grep -q "/v1" "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "three_hosts: exited early:"; cat "$1"; return 1; }
    sleep 0.2
  done
  echo "three_hosts: not up in 120 s:"; cat "$1"; return 1
}
common=(-m "$model" -t 1 --kv-memory 64MiB --allowed-hosts '*')
ip netns exec "$P" "$kvant" serve "${common[@]}" --host 10.78.0.2 --port 8101 --role prefill \
  --kv-port 9101 --prefill-weights bf16 --decode-weights bf16 2> "$tmp/p.log" &
pids+=($!); wait_up "$tmp/p.log" $! || exit 1
ip netns exec "$D" "$kvant" serve "${common[@]}" --host 10.78.0.3 --port 8102 --role decode \
  --prefill-peer 10.78.0.2:9101 --prefill-weights int4 --decode-weights int4 --int4-group 32 \
  2> "$tmp/d.log" &
pids+=($!); wait_up "$tmp/d.log" $! || exit 1
ip netns exec "$R" "$kvant" router --host 10.78.0.1 --port 8100 \
  --prefill http://10.78.0.2:8101 --decode http://10.78.0.3:8102 2> "$tmp/r.log" &
pids+=($!); wait_up "$tmp/r.log" $! || exit 1
"$kvant" serve "${common[@]}" --port 8199 --prefill-weights bf16 --decode-weights int4 \
  --int4-group 32 2> "$tmp/c.log" &
pids+=($!); wait_up "$tmp/c.log" $! || exit 1

ask='
import json, sys, urllib.request
url = sys.argv[1]
out = []
for p in ["The capital of France is", "List three prime numbers:"]:
    body = json.dumps({"model": "m", "prompt": p, "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    out.append(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"])
print(json.dumps(out))
'
name=$(basename "$model" .gguf)
ask=${ask//\"m\"/\"$name\"}
routed=$(ip netns exec "$R" python3 -c "$ask" http://10.78.0.1:8100) || { cat "$tmp"/*.log; exit 1; }
local_=$(python3 -c "$ask" http://127.0.0.1:8199) || { cat "$tmp/c.log"; exit 1; }
echo "three_hosts: through the router: $routed"
echo "three_hosts: one server:         $local_"
[ "$routed" = "$local_" ] || { echo "three_hosts: answers differ"; exit 1; }
pulls=$(ip netns exec "$D" python3 -c '
import urllib.request
m = urllib.request.urlopen("http://10.78.0.3:8102/metrics", timeout=10).read().decode()
print(int(float([l.split()[1] for l in m.splitlines() if l.startswith("kvant_kv_pulls_total ")][0])))')
echo "three_hosts: decode server pulled $pulls prompts from 10.78.0.2"
[ "$pulls" = 2 ] || exit 1
