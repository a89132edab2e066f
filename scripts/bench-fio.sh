#!/usr/bin/env bash
# The POSIX mount measured with fio, side by side with the local disk under it, in one run.
#
# Starts `flotilla local --mount` (a metadata service and 4 I/O servers whose targets are on
# the local disk, mounted through FUSE) and runs the same fio jobs, 4 processes each, in a
# directory on the mount and in a directory on the local disk next to the targets:
#   - sequential 1 MiB writes and reads, one file per job;
#   - sequential 1 MiB writes and reads of one shared file, each job its own segment;
#   - 4 KiB and 47008-byte strided writes to one shared file, each job every 4th record, and
#     the same files read back the same way.
# ONLY_STRIDED=1 runs the strided jobs alone, ONLY_SEQ=1 the sequential ones.
# Writes end with fsync (fio --end_fsync), so that both sides count the bytes reaching the
# disk; page caches are dropped before every read job (root only), and the servers' buffer
# caches are kept small (--cache-bytes), so that reads come from the disk on both sides.
#
# Usage: scripts/bench-fio.sh [DIR] (default: a new folder under target/); needs root and fio.
# Environment: SIZE_MB (per job, default 512), STRIDED_MB (whole strided file, default 512),
# ROUNDS (default 3), FLOTILLA_BIN (a flotilla binary to measure instead of building
# target/release/flotilla, e.g. an older build kept for a before/after comparison).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MB=${SIZE_MB:-512}
STRIDED_MB=${STRIDED_MB:-512}
ROUNDS=${ROUNDS:-3}
JOBS=4
WORK=${1:-$(pwd)/target/bench-fio}
command -v fio >/dev/null || { echo "bench-fio: fio is not installed (apt-get install fio)" >&2; exit 1; }

if [ -z "${FLOTILLA_BIN:-}" ]; then
    cargo build --release -p flotilla-cli >&2
    FLOTILLA_BIN=target/release/flotilla
fi
rm -rf "$WORK" && mkdir -p "$WORK/local" "$WORK/results"
MOUNT="$WORK/mnt"

"$FLOTILLA_BIN" local --data "$WORK/data" --listen 127.0.0.1:0 --servers 4 \
    --cache-bytes $((64 << 20)) --mount "$MOUNT" > "$WORK/local.out" 2> "$WORK/local.err" &
LOCAL_PID=$!
cleanup() {
    kill -TERM "$LOCAL_PID" 2>/dev/null || true
    wait "$LOCAL_PID" 2>/dev/null || true
    if grep -q " $MOUNT " /proc/mounts; then "$FLOTILLA_BIN" umount --lazy "$MOUNT" || true; fi
}
trap cleanup EXIT
for _ in $(seq 1 200); do
    grep -q '^mount=' "$WORK/local.out" 2>/dev/null && break
    sleep 0.1
done
grep -q '^mount=' "$WORK/local.out" || { echo "bench-fio: the mount did not come up" >&2; cat "$WORK/local.err" >&2; exit 1; }

drop_caches() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
}

# run_fio LABEL ROUND SIDE fio-arguments...: one fio job group, 4 processes.
run_fio() {
    local label=$1 round=$2 side=$3
    shift 3
    local dir="$WORK/local"
    if [ "$side" = mount ]; then dir="$MOUNT"; fi
    case "$label" in *read*) drop_caches ;; esac
    fio --name="$label" --directory="$dir" --numjobs=$JOBS --group_reporting --ioengine=psync \
        --output-format=json --output="$WORK/results/$label.$round.$side.json" "$@" >&2
}

# Each job runs on the local disk and then through the mount, so both see the same machine
# load; ROUNDS rounds, medians reported.
SEGMENT=${SIZE_MB}m
SEQ=(--bs=1m --size="$SEGMENT")
SHARED=(--filename=shared --bs=1m --size="$SEGMENT" --offset_increment="$SEGMENT")
STRIDED=(--size="${STRIDED_MB}m" --end_fsync=1)
for round in $(seq 1 "$ROUNDS"); do
    if [ -z "${ONLY_STRIDED:-}" ]; then
        for side in local mount; do run_fio seq-write-files "$round" "$side" --rw=write --end_fsync=1 "${SEQ[@]}"; done
        for side in local mount; do run_fio seq-read-files "$round" "$side" --rw=read "${SEQ[@]}"; done
        for side in local mount; do run_fio seq-write-shared "$round" "$side" --rw=write --end_fsync=1 "${SHARED[@]}"; done
        for side in local mount; do run_fio seq-read-shared "$round" "$side" --rw=read "${SHARED[@]}"; done
    fi
    if [ -n "${ONLY_SEQ:-}" ]; then
        rm -rf "${WORK:?}/local/"* "${MOUNT:?}/"*
        continue
    fi
    for side in local mount; do
        run_fio strided-4k "$round" "$side" --filename=strided-4k --rw=write:12k --bs=4k --offset_increment=4k "${STRIDED[@]}"
    done
    # The same file read back the same way: every job every 4th 4 KiB record.
    for side in local mount; do
        run_fio strided-4k-read "$round" "$side" --filename=strided-4k --rw=read:12k --bs=4k --offset_increment=4k \
            --size="${STRIDED_MB}m"
    done
    for side in local mount; do
        run_fio strided-47008 "$round" "$side" --filename=strided-47008 --rw=write:141024 --bs=47008 \
            --offset_increment=47008 "${STRIDED[@]}"
    done
    for side in local mount; do
        run_fio strided-47008-read "$round" "$side" --filename=strided-47008 --rw=read:141024 --bs=47008 \
            --offset_increment=47008 --size="${STRIDED_MB}m"
    done
    rm -rf "${WORK:?}/local/"* "${MOUNT:?}/"*
done

python3 - "$WORK/results" "$ROUNDS" <<'PY'
import json, pathlib, statistics, sys
results, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def rate(label, side):
    """Median over the rounds of all bytes over the group's run time (end fsync included), MB/s."""
    values = []
    for round in range(1, rounds + 1):
        job = json.loads((results / f"{label}.{round}.{side}.json").read_text())["jobs"][0]
        part = job["read"] if "read" in label else job["write"]
        values.append(part["bw_bytes"] / 1e6)
    return statistics.median(values)
labels = ["seq-write-files", "seq-read-files", "seq-write-shared", "seq-read-shared", "strided-4k", "strided-4k-read",
          "strided-47008", "strided-47008-read"]
labels = [l for l in labels if (results / f"{l}.1.local.json").exists()]
print(f"| fio job (4 processes, median of {rounds}) | local disk MB/s | mount MB/s | mount / local |")
print("|---|---:|---:|---:|")
for label in labels:
    local, mount = rate(label, "local"), rate(label, "mount")
    print(f"| {label} | {local:.0f} | {mount:.0f} | {mount / local:.2f} |")
print()
if "strided-47008" in labels:
    strided = rate("strided-47008", "mount")
    for label in [l for l in ["seq-write-files", "seq-write-shared"] if l in labels]:
        print(f"through the mount, strided-47008 / {label}: {strided / rate(label, 'mount'):.2f}")
if "strided-47008-read" in labels:
    strided_read = rate("strided-47008-read", "mount")
    for label in [l for l in ["seq-read-files", "seq-read-shared"] if l in labels]:
        print(f"through the mount, strided-47008-read / {label}: {strided_read / rate(label, 'mount'):.2f}")
PY
