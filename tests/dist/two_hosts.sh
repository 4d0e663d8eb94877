#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces kvant_nsa (10.77.0.1) and
# kvant_nsb (10.77.0.2) joined by a veth pair, then COMMAND run by mpirun
# inside kvant_nsa with one rank in each namespace (rank 1's daemon started
# in kvant_nsb by tests/dist/netns_agent.sh), MPI told to use only that
# pair. The namespaces are removed on exit, whatever happens. Exits 77 (a
# skip for ctest) with a message where namespaces cannot be made (no root,
# no iproute2, a container without the rights).
# Usage: tests/dist/two_hosts.sh PROGRAM [ARGS...]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
A=kvant_nsa B=kvant_nsb
if ! command -v ip >/dev/null 2>&1; then echo "two_hosts: no ip (iproute2): skipped"; exit 77; fi
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
cleanup
trap cleanup EXIT
if ! ip netns add "$A" 2>/dev/null || ! ip netns add "$B" 2>/dev/null; then
  echo "two_hosts: cannot create network namespaces here (needs root and CAP_SYS_ADMIN): skipped"
  exit 77
fi
set -e
ip link add kvant_va type veth peer name kvant_vb
ip link set kvant_va netns "$A"
ip link set kvant_vb netns "$B"
ip -n "$A" addr add 10.77.0.1/24 dev kvant_va
ip -n "$B" addr add 10.77.0.2/24 dev kvant_vb
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set kvant_va up
ip -n "$B" link set kvant_vb up
set +e
hosts="$(mktemp)"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$hosts"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 240 ip netns exec "$A" mpirun --allow-run-as-root --oversubscribe --bind-to none \
  -np 2 --hostfile "$hosts" --mca plm_rsh_agent "$here/netns_agent.sh" \
  --mca plm_rsh_no_tree_spawn 1 --mca pml ob1 --mca btl self,tcp \
  --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
  -x PATH "$@"
rc=$?
rm -f "$hosts"
exit $rc
