#!/usr/bin/env bash
# A throwaway Ceph cluster for tests and benchmarks: one monitor, N BlueStore
# OSDs on sparse files, an optional manager, all on 127.0.0.1 under one
# directory, no systemd. Needs root and the packages scripts/setup.sh
# installs (ceph-mon, ceph-osd, ceph-mgr).
#
#   ceph-cluster.sh start DIR [--osds N] [--port P] [--mgr] [--osd-gib G] [--owner PID]
#                             [--mon-at NS:IP] [--osd-at NS:IP]...
#       prints `CEPH_CONF=DIR/ceph.conf` when the OSDs are up; with --owner,
#       the daemons are killed when process PID ends, however it ends (a
#       test binary killed mid-run leaves no cluster behind). --mon-at runs
#       the monitor (and the manager, and the ceph CLI calls) in network
#       namespace NS on address IP, each --osd-at one OSD (their count is
#       the OSD count): namespace hosts (`netns`) as storage hosts.
#   ceph-cluster.sh pool DIR NAME SIZE [PGS]  a replicated pool of SIZE copies
#       and PGS placement groups (8)
#   ceph-cluster.sh stop DIR               kills every daemon it started
#
# The settings below are the ones that mattered (issue 48):
# - `mon osd reporter subtree level = osd`, `mon osd min down reporters = 1`:
#   every OSD is on one host, and by default an OSD is marked down only on
#   reports from another host, so a dead OSD would never be marked down.
# - `mon data avail warn/crit` low: the OSD files share the host's disk,
#   and a disk near full would otherwise send the cluster to HEALTH_ERR.
# - client op timeouts: librados waits for ever on daemons that are gone.
# - OSD files much larger than the data: a BlueStore OSD that fills up
#   aborts and its clients hang. The files are sparse, so size is free.
# - The manager (--mgr) only for usage figures (`ceph df`, pool quotas,
#   health); I/O works without it.
# - BlueStore, not memstore (memstore held 5 GB of RSS for 2 GiB of data).
set -euo pipefail

die() { echo "ceph-cluster: $*" >&2; exit 1; }

cmd=${1:-}; dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || die "usage: $0 start|pool|stop DIR [...]"
shift 2

# The namespace the monitor runs in (`--mon-at`), kept for later commands.
mon_ns() { cat "$dir/mon.netns" 2>/dev/null || true; }
in_ns() {
  local ns=$1; shift
  if [[ -n "$ns" ]]; then ip netns exec "$ns" "$@"; else "$@"; fi
}
ceph_() { in_ns "$(mon_ns)" timeout 30 ceph -c "$dir/ceph.conf" "$@"; }

stop() {
  # Only the daemons this directory's pid files name: other clusters on
  # the machine (other tests, other engineers) are left alone.
  local pids=()
  for f in "$dir"/run/*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && pids+=("$pid")
  done
  ((${#pids[@]})) && kill -9 "${pids[@]}" 2>/dev/null || true
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_daemon NAME NS CMD...: runs a daemon (in network namespace NS, if
# not empty) in the foreground of a background
# job (`-f`), so its pid is known without the daemon's own pid file.
start_daemon() {
  local name=$1 ns=$2; shift 2
  setsid bash -c 'ns=$1; shift; if [[ -n "$ns" ]]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi' _ "$ns" "$@" -f \
    >>"$dir/log/$name.out" 2>&1 < /dev/null &
  echo $! > "$dir/run/$name.pid"
}

start() {
  local osds=1 port="" mgr=0 osd_gib=100 owner="" mon_at="" osd_at=()
  while (($#)); do
    case "$1" in
      --osds) osds=$2; shift 2 ;;
      --mon-at) mon_at=$2; shift 2 ;;
      --osd-at) osd_at+=("$2"); shift 2 ;;
      --port) port=$2; shift 2 ;;
      --mgr) mgr=1; shift ;;
      --osd-gib) osd_gib=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [[ "$(id -u)" == 0 ]] || die "needs root (the daemons bind and write as root)"
  for b in ceph-mon ceph-osd ceph-authtool monmaptool ceph; do
    command -v "$b" >/dev/null || die "$b is missing: run scripts/setup.sh"
  done
  [[ -n "$port" ]] || port=$(free_port)
  local t0=$SECONDS
  mkdir -p "$dir"/{run,log,mon,osd}
  dir=$(cd "$dir" && pwd)
  local mon_ip=127.0.0.1 ns=""
  if [[ -n "$mon_at" ]]; then
    ns=${mon_at%%:*} mon_ip=${mon_at#*:}
    echo "$ns" > "$dir/mon.netns"
  fi
  ((${#osd_at[@]} == 0)) || osds=${#osd_at[@]}
  local fsid; fsid=$(cat /proc/sys/kernel/random/uuid)
  cat > "$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon host = v2:$mon_ip:$port
mon initial members = a
ms bind msgr1 = false
ms bind ipv6 = false
public addr = $mon_ip
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $dir/\$name.keyring
run dir = $dir/run
# Clients (a store node, each slave) each need a socket of their own.
admin socket = $dir/run/\$name.\$pid.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.daemon-pid
crash dir = $dir/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon osd reporter subtree level = osd
mon osd min down reporters = 1
osd heartbeat grace = 6
osd heartbeat interval = 2
mon data avail warn = 2
mon data avail crit = 1
rados osd op timeout = 20
rados mon op timeout = 20
client mount timeout = 20
osd max object size = 1073741824
# Pool usage reaches the monitors through the manager; each second, so a
# pool's quota (the tests' full pool) takes effect soon after it is met.
mgr stats period = 1
[mon]
mon data = $dir/mon/\$name
[osd]
osd data = $dir/osd/\$id
osd objectstore = bluestore
bluestore block path = $dir/osd/\$id.block
bluestore block create = true
bluestore block size = $((osd_gib << 30))
bluestore fsck on mount = false
osd memory target = 1073741824
osd class load list = *
EOF
  ceph-authtool --create-keyring "$dir/mon.a.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.a.keyring" --import-keyring "$dir/client.admin.keyring" >/dev/null
  monmaptool --create --addv a "[v2:$mon_ip:$port]" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$dir/ceph.conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.a.keyring"
  start_daemon mon.a "$ns" ceph-mon -c "$dir/ceph.conf" -i a
  if ((mgr)); then
    mkdir -p "$dir/mgr/x"
    ceph_ auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' > "$dir/mgr.x.keyring"
    start_daemon mgr.x "$ns" ceph-mgr -c "$dir/ceph.conf" -i x --mgr-data "$dir/mgr/x"
  fi
  for ((i = 0; i < osds; i++)); do
    local uuid id; uuid=$(cat /proc/sys/kernel/random/uuid)
    id=$(ceph_ osd new "$uuid")
    mkdir -p "$dir/osd/$id"
    ceph-osd -c "$dir/ceph.conf" -i "$id" --mkfs --no-mon-config --osd-uuid "$uuid" \
      --keyring "$dir/osd.$id.keyring" --mkkey >>"$dir/log/osd.$id.mkfs" 2>&1 \
      || { stop; die "mkfs of osd.$id failed: see $dir/log/osd.$id.mkfs"; }
    ceph_ auth add "osd.$id" osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
      -i "$dir/osd.$id.keyring" >/dev/null 2>&1
    local at=${osd_at[$i]:-} osd_ns="" addr=()
    if [[ -n "$at" ]]; then
      osd_ns=${at%%:*}
      addr=(--public-addr "${at#*:}" --cluster-addr "${at#*:}")
    fi
    start_daemon "osd.$id" "$osd_ns" ceph-osd -c "$dir/ceph.conf" -i "$id" "${addr[@]}"
  done
  # Up when the OSDs say so in the map; writes are checked by `pool`.
  local deadline=$((SECONDS + 60))
  until [[ "$(ceph_ osd stat --format json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["num_up_osds"])' 2>/dev/null)" == "$osds" ]]; do
    ((SECONDS < deadline)) || { stop; die "the OSDs did not come up within 60 s: see $dir/log"; }
    sleep 0.2
  done
  if [[ -n "$owner" ]]; then
    (
      while kill -0 "$owner" 2>/dev/null; do sleep 1; done
      stop
    ) </dev/null >/dev/null 2>&1 &
    disown
  fi
  echo "ceph-cluster: $osds OSD(s) up in $((SECONDS - t0)) s" >&2
  echo "CEPH_CONF=$dir/ceph.conf"
}

pool() {
  local name=${1:?pool name} size=${2:-1} pgs=${3:-8}
  ceph_ osd pool create "$name" "$pgs" "$pgs" replicated >/dev/null 2>&1
  ceph_ osd pool set "$name" size "$size" --yes-i-really-mean-it >/dev/null 2>&1
  ceph_ osd pool set "$name" min_size 1 >/dev/null 2>&1
  ceph_ osd pool application enable "$name" ftbag >/dev/null 2>&1
  # Written to once, so the PGs are active before a test starts timing.
  local deadline=$((SECONDS + 60))
  until echo probe | in_ns "$(mon_ns)" timeout 10 rados -c "$dir/ceph.conf" -p "$name" put .probe - 2>/dev/null; do
    ((SECONDS < deadline)) || die "pool $name took no write within 60 s"
    sleep 0.2
  done
  in_ns "$(mon_ns)" timeout 10 rados -c "$dir/ceph.conf" -p "$name" rm .probe
}

case "$cmd" in
  start) start "$@" ;;
  pool) pool "$@" ;;
  stop) stop ;;
  *) die "unknown command $cmd" ;;
esac
