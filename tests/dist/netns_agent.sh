#!/bin/sh
# mpirun's remote-launch agent (--mca plm_rsh_agent) for the two-host test:
# "host" 10.77.0.2 is the network namespace kvant_nsb, so its daemon starts
# there, joined to mpirun's namespace by a veth pair (tests/dist/two_hosts.sh).
# Open MPI calls it as: AGENT [options] HOST COMMAND...
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"
shift
case "$host" in
  10.77.0.1) ns="${KVANT_NS_A:-kvant_nsa}" ;;
  10.77.0.2) ns="${KVANT_NS_B:-kvant_nsb}" ;;
  *) echo "netns_agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
