#!/usr/bin/env bash
# Two network stacks joined by a veth pair, for running the active and the passive party without
# loopback (issue 53; docs/deployment.md, "Parties on separate network stacks"). Needs root (ip netns).
#
#   scripts/netns_pair.sh up   [NAME]   # namespaces NAME-a (10.200.0.1) and NAME-p (10.200.0.2)
#   scripts/netns_pair.sh down [NAME]
#
# Then, e.g.:
#   ip netns exec svfl-p securevfl party --role passive1 --listen 10.200.0.2:50051 ... &
#   ip netns exec svfl-a securevfl train --peer passive1=10.200.0.2:50051 ...
# Optional WAN figures: `ip netns exec svfl-a tc qdisc add dev svfl-a0 root netem delay 25ms rate 100mbit`
# (and the same on svfl-p0) delays both directions on the pair itself.
set -euo pipefail
cmd=${1:?usage: netns_pair.sh up|down [NAME]}
name=${2:-svfl}
a="$name-a" p="$name-p"
case "$cmd" in
  up)
    ip netns add "$a"
    ip netns add "$p"
    ip link add "${name}-a0" type veth peer name "${name}-p0"
    ip link set "${name}-a0" netns "$a"
    ip link set "${name}-p0" netns "$p"
    ip -n "$a" addr add 10.200.0.1/24 dev "${name}-a0"
    ip -n "$p" addr add 10.200.0.2/24 dev "${name}-p0"
    for ns in "$a" "$p"; do ip -n "$ns" link set lo up; done
    ip -n "$a" link set "${name}-a0" up
    ip -n "$p" link set "${name}-p0" up
    echo "namespaces $a (10.200.0.1) and $p (10.200.0.2) are up"
    ;;
  down)
    ip netns del "$a" 2>/dev/null || true  # deleting a namespace removes its end of the pair, and the pair
    ip netns del "$p" 2>/dev/null || true
    ;;
  *) echo "usage: netns_pair.sh up|down [NAME]" >&2; exit 2 ;;
esac
