#!/usr/bin/env bash
# Usage: N=32768 B=target/debug [COPY=dir] docs/measure-backup.sh (needs N²×8 bytes free on $D's disk, and on COPY's).
# Backup figures: a large node (a sparse .npy of N×N zeros imported at
# b = 2048), `master backup` of it (links), a job's time alone and with a
# backup taken while it runs, and a copy backup of a smaller node to a tmpfs.
set -euo pipefail
B=${B:-target/debug}
D=${D:-/tmp/ftbag-backup-measure}
N=${N:-40960}
export STORE=127.0.0.1:7391 OPENBLAS_NUM_THREADS=1
rm -rf $D; mkdir -p $D
$B/master serve --data $D/live --listen $STORE > $D/serve.log 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; kill ${SLAVES:-} 2>/dev/null; true' EXIT
sleep 2
python3 - "$N" "$D/big.npy" <<'PY'
import sys, struct
n, path = int(sys.argv[1]), sys.argv[2]
h = ("{'descr': '<f8', 'fortran_order': True, 'shape': (%d, %d), }" % (n, n)).encode()
pad = (64 - (len(h) + 10 + 1) % 64) % 64
h += b' ' * pad + b'\n'
with open(path, 'wb') as f:
    f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(h)) + h)
    f.truncate(10 + len(h) + n * n * 8)
PY
t0=$(date +%s.%N)
$B/master matrix import BIG $D/big.npy --block 2048 --quiet --store $STORE
t1=$(date +%s.%N)
rm -f $D/big.npy
echo "import of ${N}² doubles: $(echo "$t1 - $t0" | bc) s"
du -sh $D/live
sync
echo "--- backup of the large node, idle"
$B/master backup $D/backup-idle --store $STORE
du -sh --apparent-size $D/backup-idle; du -sh $D/backup-idle
# With COPY=<a directory on another filesystem>: a copy backup of the
# large node there (every block's bytes written and synced).
if [[ -n ${COPY:-} ]]; then
  echo "--- copy backup of the large node into $COPY"
  $B/master backup $COPY/backup-copy --store $STORE --json
  du -sh $COPY/backup-copy
  rm -rf $COPY/backup-copy
fi
# A job alone, then the same job with a backup taken a few seconds in.
$B/master matrix create A --n 3072 --block 256 --seed 1 --quiet --store $STORE >/dev/null
$B/master matrix create Bm --n 3072 --block 256 --seed 2 --quiet --store $STORE >/dev/null
$B/slave --store $STORE --name s0 >$D/s0.log 2>&1 & S0=$!
$B/slave --store $STORE --name s1 >$D/s1.log 2>&1 & S1=$!
SLAVES="$S0 $S1"
for run in alone with-backup alone2 with-backup2; do
  job=$($B/master submit matmul A Bm --out C-$run --store $STORE)
  t0=$(date +%s.%N)
  if [[ $run == with-backup* ]]; then
    sleep 3
    $B/master backup $D/backup-$run --store $STORE --json
  fi
  $B/master wait $job --store $STORE >/dev/null
  t1=$(date +%s.%N)
  echo "job $run: $(echo "$t1 - $t0" | bc) s"
done
kill $SLAVES; SLAVES=
echo "--- copy backup of a 2 GiB node into a tmpfs"
$B/master matrix rm BIG --store $STORE >/dev/null
$B/master matrix create M2 --n 16384 --block 2048 --seed 3 --quiet --store $STORE >/dev/null
mkdir -p /dev/shm/bk-measure
$B/master backup /dev/shm/bk-measure/copy --store $STORE
du -sh /dev/shm/bk-measure/copy
rm -rf /dev/shm/bk-measure
