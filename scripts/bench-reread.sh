#!/bin/bash
# Needs root (mounts, drop_caches).
# Usage: reread.sh BINARY — mount W writes a 256 MiB file, mount R reads it twice per round
# (caches dropped before the first); prints dd's rate and the servers' read requests.
set -euo pipefail
B=$1; D=$(mktemp -d /tmp/reread.XXXX); R=$D/reader; W=$D/writer; mkdir -p $R $W
$B local --servers 4 --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data $D/data > $D/local.out 2>$D/local.err &
LP=$!
for i in $(seq 100); do grep -q '^metrics=' $D/local.out 2>/dev/null && break; sleep 0.2; done
META=$(sed -n 's/^meta=//p' $D/local.out); KEY=$(sed -n 's/^key=//p' $D/local.out); MET=$(sed -n 's/^metrics=//p' $D/local.out)
$B --key $KEY mount --meta $META $R > $D/r.out 2>$D/r.err &
RP=$!
$B --key $KEY mount --meta $META $W > $D/w.out 2>$D/w.err &
WP=$!
for i in $(seq 100); do grep -q '^mount=' $D/r.out && grep -q '^mount=' $D/w.out && break; sleep 0.2; done
reads() { curl -s http://$MET/metrics | awk '/^flotilla_server_request_duration_seconds_count/ && /kind="read"/ {n+=$2} END {print n+0}'; }
dd if=/dev/urandom of=$W/f bs=1M count=256 status=none
for round in 1 2 3; do
  sync; echo 3 > /proc/sys/vm/drop_caches
  for pass in first again; do
    r0=$(reads); rate=$(dd if=$R/f of=/dev/null bs=1M 2>&1 | tail -1 | awk '{print $(NF-1), $NF}'); r1=$(reads)
    echo "round $round $pass: $rate, server read requests $((r1 - r0))"
  done
done
umount $R || umount -l $R; umount $W || umount -l $W
kill $RP $WP $LP 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $D
