#!/usr/bin/env bash
# Two network stacks joined by a veth pair, for running the active and the passive party without
# loopback (issue 53; docs/deployment.md, "Parties on separate network stacks"). Needs root (ip netns).
#
#   scripts/netns_pair.sh up   [NAME]   # namespaces NAME-a (10.200.0.1) and NAME-p (10.200.0.2)
#   scripts/netns_pair.sh down [NAME]
#
# NAME defaults to svfl<uid> (svfl0 for root), so two users on one host do not collide; a name in use
# is refused with one line (pick another NAME, or `down` it). Interface names are NAME-a0/NAME-p0
# (at most 15 characters: NAME at most 12). Then, e.g. with NAME svfl:
#   ip netns exec svfl-p securevfl party --role passive1 --listen 10.200.0.2:50051 ... &
#   ip netns exec svfl-a securevfl train --peer passive1=10.200.0.2:50051 ...
# Optional WAN figures: `ip netns exec svfl-a tc qdisc add dev svfl-a0 root netem delay 25ms rate 100mbit`
# (and the same on svfl-p0) delays both directions on the pair itself.
set -euo pipefail
cmd=${1:?usage: netns_pair.sh up|down [NAME]}
name=${2:-svfl$(id -u)}
a="$name-a" p="$name-p"
if [ ${#name} -gt 12 ]; then echo "error: NAME '$name' is longer than 12 characters (interface names hold 15)" >&2; exit 2; fi
case "$cmd" in
  up)
    for ns in "$a" "$p"; do
      if ip netns list | awk '{print $1}' | grep -qx "$ns"; then
        echo "error: namespace $ns exists already (another user's or an earlier run's): pass another NAME, or run 'netns_pair.sh down $name'" >&2
        exit 2
      fi
    done
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
