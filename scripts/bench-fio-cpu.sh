#!/bin/bash
set -euo pipefail
# CPU seconds of the whole machine (/proc/stat busy time, other work included: run it on a
# quiet machine) per GiB moved by fio's sequential jobs (4 x 512 MiB, 1 MiB requests, writes
# with end_fsync, page cache dropped before each job), on the local disk and through a mount
# of `flotilla local --servers 4`. Usage: [FLOTILLA_BIN=...] bash scripts/bench-fio-cpu.sh [WORK]
BIN=${FLOTILLA_BIN:-target/release/flotilla}
WORK=${1:-$(pwd)/target/bench-fio-cpu}
rm -rf "$WORK"; mkdir -p "$WORK/local"
MOUNT="$WORK/mnt"
"$BIN" local --data "$WORK/data" --listen 127.0.0.1:0 --servers 4 --cache-bytes $((64 << 20)) --mount "$MOUNT" > "$WORK/local.out" 2> "$WORK/local.err" &
PID=$!
trap 'kill -TERM $PID; wait $PID; grep -q " $MOUNT " /proc/mounts && "$BIN" umount --lazy "$MOUNT"' EXIT
for _ in $(seq 1 200); do grep -q '^mount=' "$WORK/local.out" 2>/dev/null && break; sleep 0.1; done
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
steal() { awk '/^cpu /{print $9}' /proc/stat; }
for round in 1 2; do
for side in local mount; do
  dir="$WORK/local"; [ $side = mount ] && dir="$MOUNT"
  for job in write read; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    b0=$(busy); t0=$(date +%s.%N)
    extra=""; [ $job = write ] && extra="--end_fsync=1"
    fio --name=seq-$job --directory="$dir" --numjobs=4 --group_reporting --ioengine=psync --rw=$job --bs=1m --size=512m $extra --output-format=json --output="$WORK/$side-$job-$round.json" >/dev/null 2>&1
    b1=$(busy); t1=$(date +%s.%N)
    python3 -c "
import json
d=json.load(open('$WORK/$side-$job-$round.json'))['jobs'][0]['$job']
print('round $round $side $job: %.0f MB/s, CPU %.2f s per GiB, wall %.1f s, load %s' % (d['bw_bytes']/1e6, ($b1-$b0)/100/2.0, $t1-$t0, open('/proc/loadavg').read().split()[0]))"
    [ $job = read ] && rm -f "$dir"/seq-*
  done
done; done
