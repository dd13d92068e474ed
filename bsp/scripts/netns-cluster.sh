#!/usr/bin/env bash
# A small cluster of network-namespace "hosts" on one machine: N namespaces,
# each with a veth pair into one bridge and its own address in 10.77.0.0/24,
# optionally shaped with tc netem (e.g. RATE=1gbit DELAY=0.1ms). Runs the BSP
# probe (or any command) across them, then removes everything it created
# (trap on EXIT/INT/TERM). Only addresses inside these namespaces are used.
#
#   sudo bsp/scripts/netns-cluster.sh [-n 4] [--rate 1gbit] [--delay 0.1ms] -- BSP_WORKER_COMMAND...
#
# The command is started once per host, inside its namespace, with
# BSP_PID, BSP_HOSTS (all hosts' addr:port), BSP_BIND and STORE_TOKEN set,
# e.g.  -- target/release/bench bsp --worker probe --quick
# Process 0's stdout is printed; the others' goes to $LOGDIR.
set -euo pipefail

N=4; RATE=""; DELAY=""; PORT=7400
PREFIX="bspns$$"; BR="bspbr$$"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N="$2"; shift 2;;
    --rate) RATE="$2"; shift 2;;
    --delay) DELAY="$2"; shift 2;;
    --) shift; break;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [-n N] [--rate R] [--delay D] -- command..." >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns)" >&2; exit 2; }

LOGDIR=$(mktemp -d)
cleanup() {
  set +e
  for i in $(seq 0 $((N-1))); do
    ip netns pids "${PREFIX}$i" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "${PREFIX}$i" 2>/dev/null
    ip link del "${PREFIX}v$i" 2>/dev/null
  done
  ip link del "$BR" 2>/dev/null
  rm -rf "$LOGDIR"
}
trap cleanup EXIT INT TERM

ip link add "$BR" type bridge
ip link set "$BR" up
HOSTS=""
for i in $(seq 0 $((N-1))); do
  ns="${PREFIX}$i"
  ip netns add "$ns"
  ip link add "${PREFIX}v$i" type veth peer name eth0 netns "$ns"
  ip link set "${PREFIX}v$i" master "$BR" up
  ip -n "$ns" addr add "10.77.0.$((i+10))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [[ -n "$RATE" || -n "$DELAY" ]]; then
    args=(); [[ -n "$DELAY" ]] && args+=(delay "$DELAY"); [[ -n "$RATE" ]] && args+=(rate "$RATE")
    if ! ip netns exec "$ns" tc qdisc add dev eth0 root netem "${args[@]}" 2>/dev/null; then
      # Kernels without sch_netem: shape the rate with tbf, say the delay is missing.
      [[ $i -eq 0 ]] && echo "netem unavailable: ${DELAY:+delay $DELAY NOT applied; }${RATE:+rate via tbf}" >&2
      if [[ -n "$RATE" ]]; then
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 64kb latency 50ms
      fi
    fi
  fi
  HOSTS+="${HOSTS:+,}10.77.0.$((i+10)):$PORT"
done

TOKEN=${STORE_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
pids=()
for i in $(seq 1 $((N-1))); do
  ip netns exec "${PREFIX}$i" env BSP_PID=$i BSP_HOSTS="$HOSTS" BSP_BIND="10.77.0.$((i+10)):$PORT" STORE_TOKEN="$TOKEN" "$@" >"$LOGDIR/$i.log" 2>&1 &
  pids+=($!)
done
rc=0
ip netns exec "${PREFIX}0" env BSP_PID=0 BSP_HOSTS="$HOSTS" BSP_BIND="10.77.0.10:$PORT" STORE_TOKEN="$TOKEN" "$@" || rc=$?
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
[[ $rc -eq 0 ]] || { echo "a host failed (rc $rc); logs:" >&2; tail -n 5 "$LOGDIR"/*.log >&2; }
exit $rc
