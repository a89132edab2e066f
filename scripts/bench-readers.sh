#!/usr/bin/env bash
# Random, sequential and strided readers through the mount, each with the defaults and with
# the settings that could suit it better, side by side in one run (issue 34).
#
# Starts `flotilla local` (a metadata service and 4 I/O servers on the local disk) and three
# `flotilla mount`s of it: the defaults, `--kernel-cache off` and `--readahead-bytes 0`. One
# file of FILE_MB is written once; each round every reader runs once through every mount,
# the page caches dropped before each run (root):
#   - randread: fio randread, bs=4k, libaio, direct=1, iodepth=16, RAND_S seconds;
#   - randread-buffered: the same without O_DIRECT (psync, one process): a random reader
#     under the kernel's page cache;
#   - seqread: fio read, bs=1m, psync (buffered), the whole file;
#   - strided: 4 processes reading every 4th 4 KiB record each (fio read:12k, bs=4k,
#     offset_increment=4k), the whole file between them.
# Prints, per reader, the median over ROUNDS of each mount's IOPS (random) or MB/s, and the
# defaults' share of the best setting's figure.
#
# Usage: scripts/bench-readers.sh [DIR] (default target/bench-readers); needs root and fio.
# Environment: FILE_MB (default 512), RAND_S (default 10), ROUNDS (default 3), READERS (a
# subset of "randread randread-buffered seqread strided"), WRITER (the mount that writes the
# file, default defaults), ORDER (the mounts' order in a
# first round, rotated by one each round; default "defaults kernel-cache-off readahead-0"),
# FLOTILLA_BIN (a flotilla binary to
# measure instead of building target/release/flotilla), BASE_BIN (another build's flotilla
# binary, e.g. main's: a fourth mount `base` of the same cluster with the defaults, measured
# in the same rounds, so that two builds are compared side by side in one run).
set -euo pipefail
cd "$(dirname "$0")/.."

FILE_MB=${FILE_MB:-512}
RAND_S=${RAND_S:-10}
ROUNDS=${ROUNDS:-3}
WORK=${1:-$(pwd)/target/bench-readers}
command -v fio >/dev/null || { echo "bench-readers: fio is not installed (apt-get install fio)" >&2; exit 1; }
if [ -z "${FLOTILLA_BIN:-}" ]; then
    cargo build --release -p flotilla-cli >&2
    FLOTILLA_BIN=target/release/flotilla
fi
rm -rf "$WORK" && mkdir -p "$WORK/results"

"$FLOTILLA_BIN" local --data "$WORK/data" --listen 127.0.0.1:0 --servers 4 --cache-bytes $((64 << 20)) \
    > "$WORK/local.out" 2> "$WORK/local.err" &
PIDS=($!)
MOUNTS=()
cleanup() {
    for mnt in "${MOUNTS[@]}"; do "$FLOTILLA_BIN" umount --lazy "$mnt" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
for _ in $(seq 1 200); do
    grep -q '^key=' "$WORK/local.out" 2>/dev/null && break
    sleep 0.1
done
META=$(sed -n 's/^meta=//p' "$WORK/local.out")
KEY=$(sed -n 's/^key=//p' "$WORK/local.out")
[ -n "$KEY" ] || { echo "bench-readers: flotilla local did not come up" >&2; cat "$WORK/local.err" >&2; exit 1; }

# mount NAME OPTIONS...: a mount of the cluster at $WORK/NAME (by $MOUNT_BIN, else $FLOTILLA_BIN).
mount_as() {
    local name=$1 dir=$WORK/$1
    shift
    mkdir -p "$dir"
    "${MOUNT_BIN:-$FLOTILLA_BIN}" --key "$KEY" mount --meta "$META" "$@" "$dir" > "$WORK/$name.out" 2> "$WORK/$name.err" &
    PIDS+=($!)
    MOUNTS+=("$dir")
    for _ in $(seq 1 200); do
        grep -q '^mount=' "$WORK/$name.out" 2>/dev/null && return
        sleep 0.1
    done
    echo "bench-readers: mount $name did not come up" >&2; cat "$WORK/$name.err" >&2; exit 1
}
mount_as defaults
mount_as kernel-cache-off --kernel-cache off
mount_as readahead-0 --readahead-bytes 0
DEFAULT_ORDER="defaults kernel-cache-off readahead-0"
if [ -n "${BASE_BIN:-}" ]; then
    MOUNT_BIN=$BASE_BIN mount_as base
    DEFAULT_ORDER="$DEFAULT_ORDER base"
fi
read -r -a SETTINGS <<< "${ORDER:-$DEFAULT_ORDER}"
READERS=${READERS:-randread randread-buffered seqread strided}

fio --name=layout --filename="$WORK/${WRITER:-defaults}/file" --rw=write --bs=1m --size="${FILE_MB}m" \
    --ioengine=psync --end_fsync=1 > /dev/null

drop_caches() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
}

# run READER ROUND SETTING fio-arguments...
run() {
    local reader=$1 round=$2 setting=$3
    shift 3
    drop_caches
    fio --name="$reader" --filename="$WORK/$setting/file" --size="${FILE_MB}m" --group_reporting \
        --randrepeat=0 --output-format=json --output="$WORK/results/$reader.$round.$setting.json" "$@" >&2
}

for round in $(seq 1 "$ROUNDS"); do
    # The mounts take turns going first (what ran before a reader changed its figures).
    first=$(( (round - 1) % ${#SETTINGS[@]} ))
    for setting in "${SETTINGS[@]:first}" "${SETTINGS[@]:0:first}"; do
        for reader in $READERS; do
            case $reader in
            randread) run randread "$round" "$setting" --rw=randread --bs=4k --ioengine=libaio --direct=1 \
                --iodepth=16 --norandommap --runtime="$RAND_S" --time_based ;;
            randread-buffered) run randread-buffered "$round" "$setting" --rw=randread --bs=4k \
                --ioengine=psync --direct=0 --norandommap --runtime="$RAND_S" --time_based ;;
            seqread) run seqread "$round" "$setting" --rw=read --bs=1m --ioengine=psync --direct=0 ;;
            strided) run strided "$round" "$setting" --rw=read:12k --bs=4k --numjobs=4 --offset_increment=4k \
                --ioengine=psync --direct=0 ;;
            esac
        done
    done
done

python3 - "$WORK/results" "$ROUNDS" "$READERS" "${SETTINGS[@]}" <<'PY'
import json, pathlib, statistics, sys
results, rounds, readers = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split()
settings = ["defaults"] + [s for s in sys.argv[4:] if s != "defaults"]
def figure(reader, setting):
    """Median over the rounds: IOPS for the random readers, MB/s for the others."""
    values = []
    for round in range(1, rounds + 1):
        read = json.loads((results / f"{reader}.{round}.{setting}.json").read_text())["jobs"][0]["read"]
        values.append(read["iops"] if reader.startswith("randread") else read["bw_bytes"] / 1e6)
    return statistics.median(values)
# The best setting of this build (a base build's mount is compared on its own).
own = [s for s in settings if s != "base"]
base = " | defaults / base" if "base" in settings else ""
print(f"| reader (median of {rounds}) | unit | " + " | ".join(settings) + f" | defaults / best{base} |")
print("|---|---|" + "---:|" * (len(settings) + 1 + bool(base)))
for reader in readers:
    figures = {setting: figure(reader, setting) for setting in settings}
    unit = "IOPS" if reader.startswith("randread") else "MB/s"
    cells = " | ".join(f"{figures[setting]:,.0f}" for setting in settings)
    best = figures["defaults"] / max(figures[s] for s in own)
    against = f" | {figures['defaults'] / figures['base']:.2f}" if base else ""
    print(f"| {reader} | {unit} | {cells} | {best:.2f}{against} |")
PY
