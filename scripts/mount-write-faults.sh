#!/usr/bin/env bash
# Page faults and CPU time of a mount while it writes: for each binary given, starts
# `flotilla local --servers 4 --mount` (metadata service, I/O servers and the mount in one
# process), lets 4 `dd` writers put 4 x SIZE_MB MiB through the mount (1 MiB writes, fsync)
# once to warm up, then counts the process's page faults and task clock (`perf stat`) over a
# second pass. Faults are counted, not timed, so the figure holds on a busy machine.
#
# Usage: scripts/mount-write-faults.sh BINARY... (needs root, FUSE and perf).
# Environment: SIZE_MB (per writer, default 384), WORK (default target/mount-write-faults).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${SIZE_MB:-384}
WORK=${WORK:-$(pwd)/target/mount-write-faults}
command -v perf >/dev/null || { echo "mount-write-faults: perf is not installed" >&2; exit 1; }

measure() {
    local binary=$1
    rm -rf "$WORK" && mkdir -p "$WORK"
    "$binary" local --data "$WORK/data" --listen 127.0.0.1:0 --servers 4 --cache-bytes $((64 << 20)) \
        --mount "$WORK/mnt" > "$WORK/out" 2> "$WORK/err" &
    local pid=$! stat_pid=""
    for _ in $(seq 1 200); do grep -q '^mount=' "$WORK/out" 2>/dev/null && break; sleep 0.1; done
    grep -q '^mount=' "$WORK/out" || { echo "the mount of $binary did not come up" >&2; kill "$pid"; return 1; }
    for pass in warm-up measured; do
        rm -f "$WORK"/mnt/f*
        if [ "$pass" = measured ]; then
            perf stat -e page-faults,task-clock -p "$pid" -o "$WORK/stat.txt" &
            stat_pid=$!
            sleep 0.5
        fi
        local writers=()
        for j in 1 2 3 4; do
            dd if=/dev/zero of="$WORK/mnt/f$j" bs=1M count="$SIZE_MB" conv=fsync status=none &
            writers+=($!)
        done
        wait "${writers[@]}"
    done
    kill -INT "$stat_pid"
    wait "$stat_pid" 2>/dev/null || true
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    local faults clock
    faults=$(awk '/page-faults/ {gsub(",", "", $1); print $1}' "$WORK/stat.txt")
    clock=$(awk '/task-clock/ {gsub(",", "", $1); print $1}' "$WORK/stat.txt")
    echo "$binary: $faults page faults, $clock ms of CPU for $((4 * SIZE_MB)) MiB written"
}

for binary in "$@"; do
    measure "$binary"
done
