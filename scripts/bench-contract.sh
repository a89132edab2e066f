#!/usr/bin/env bash
# The cost of the durability contract, side by side in one run: two or more `flotilla`
# binaries (e.g. the commit before commit-on-close and the current one), each running the same
# two write workloads on a fresh `flotilla local --mount` (4 I/O servers on the local disk),
# alternating binaries within every round so they see the same machine load:
#   - fio: sequential 1 MiB writes through the mount, one file per job, 4 jobs;
#   - IOR-style file per process through the library: 4 `flotilla put` processes at once,
#     each storing its own file;
# and, for scale, the same fio job on the local disk under the targets, without and with
# fsync before close (`--fsync_on_close=1`): what durability costs a local file system here.
# Rates are end to end (wall clock from start to the last close returning), because the
# contract moves work into close. Medians over ROUNDS rounds; the ratio is to the first binary.
#
# Usage: scripts/bench-contract.sh BIN_BEFORE BIN_AFTER [BIN...]   (needs root and fio)
# Environment: SIZE_MB (per job/process, default 256), ROUNDS (default 5), WORK (scratch dir).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 2 ] || { echo "usage: $0 BIN_BEFORE BIN_AFTER [BIN...]" >&2; exit 2; }
command -v fio >/dev/null || { echo "bench-contract: fio is not installed (apt-get install fio)" >&2; exit 1; }
SIZE_MB=${SIZE_MB:-256}
ROUNDS=${ROUNDS:-5}
JOBS=4
WORK=${WORK:-$(pwd)/target/bench-contract}
rm -rf "$WORK" && mkdir -p "$WORK/results"
SOURCE="$WORK/source"
head -c "$((SIZE_MB << 20))" /dev/urandom > "$SOURCE"

now() { date +%s.%N; }

# start BIN: a fresh `flotilla local --mount` in $WORK/run; sets LOCAL_PID and META.
start() {
    local bin=$1
    rm -rf "$WORK/run" && mkdir -p "$WORK/run"
    "$bin" local --data "$WORK/run/data" --listen 127.0.0.1:0 --servers 4 --mount "$WORK/run/mnt" \
        > "$WORK/run/local.out" 2> "$WORK/run/local.err" &
    LOCAL_PID=$!
    for _ in $(seq 1 300); do
        grep -q '^mount=' "$WORK/run/local.out" 2>/dev/null && break
        sleep 0.1
    done
    grep -q '^mount=' "$WORK/run/local.out" || { echo "bench-contract: $bin did not mount" >&2; cat "$WORK/run/local.err" >&2; exit 1; }
    META=$(sed -n 's/^meta=//p' "$WORK/run/local.out")
    # Binaries with authentication print the client credential they made; older ones do not.
    FLOTILLA_KEY=$(sed -n 's/^key=//p' "$WORK/run/local.out")
    export FLOTILLA_KEY
}

stop() {
    kill -TERM "$LOCAL_PID" 2>/dev/null || true
    wait "$LOCAL_PID" 2>/dev/null || true
    if grep -q " $WORK/run/mnt " /proc/mounts; then "$1" umount --lazy "$WORK/run/mnt" || true; fi
}

# MB/s for BYTES written between START and END.
rate() { echo "$1 $2 $3" | awk '{ printf "%.1f", $1 / 1048576 / ($3 - $2) }'; }

LOCAL_PID=""
LAST_BIN=$1
cleanup() {
    if [ -n "$LOCAL_PID" ]; then stop "$LAST_BIN"; fi
}
trap cleanup EXIT

total_bytes=$((JOBS * SIZE_MB << 20))
local_fio() {
    rm -rf "$WORK/local" && mkdir -p "$WORK/local"
    local t0 t1
    t0=$(now)
    fio --name=local --directory="$WORK/local" --numjobs=$JOBS --ioengine=psync --rw=write --bs=1m \
        --size="${SIZE_MB}m" --group_reporting --output=/dev/null "$@"
    t1=$(now)
    rate "$total_bytes" "$t0" "$t1"
}

for round in $(seq 1 "$ROUNDS"); do
    echo "local fio $(local_fio)" >> "$WORK/results/rates"
    echo "local-fsync fio $(local_fio --fsync_on_close=1)" >> "$WORK/results/rates"
    rm -rf "$WORK/local"
    index=0
    for bin in "$@"; do
        LAST_BIN=$bin
        start "$bin"
        t0=$(now)
        fio --name=seq-write-files --directory="$WORK/run/mnt" --numjobs=$JOBS --ioengine=psync \
            --rw=write --bs=1m --size="${SIZE_MB}m" --group_reporting --output=/dev/null
        t1=$(now)
        echo "$index fio $(rate "$total_bytes" "$t0" "$t1")" >> "$WORK/results/rates"
        t0=$(now)
        puts=()
        for job in $(seq 1 $JOBS); do
            "$bin" put --meta "$META" "$SOURCE" "/put-$job" &
            puts+=($!)
        done
        for pid in "${puts[@]}"; do wait "$pid"; done
        t1=$(now)
        for job in $(seq 1 $JOBS); do
            described=$("$bin" stat --meta "$META" "/put-$job")
            [[ "$described" == *"$((SIZE_MB << 20))"* ]] \
                || { echo "bench-contract: /put-$job has the wrong size: $described" >&2; exit 1; }
        done
        echo "$index put $(rate "$total_bytes" "$t0" "$t1")" >> "$WORK/results/rates"
        stop "$bin"
        LOCAL_PID=""
        index=$((index + 1))
    done
    echo "round $round done" >&2
done

echo "# $JOBS jobs x $SIZE_MB MiB, $ROUNDS rounds, medians (MB/s), ratio to the first binary"
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for side in local local-fsync; do
    m=$(awk -v i="$side" '$1 == i { print $3 }' "$WORK/results/rates" | median)
    echo "fio	$side disk	median $m"
done
for workload in fio put; do
    first=""
    index=0
    for bin in "$@"; do
        m=$(awk -v i="$index" -v w="$workload" '$1 == i && $2 == w { print $3 }' "$WORK/results/rates" | median)
        all=$(awk -v i="$index" -v w="$workload" '$1 == i && $2 == w { printf "%s ", $3 }' "$WORK/results/rates")
        [ -z "$first" ] && first=$m
        ratio=$(echo "$m $first" | awk '{ printf "%.2f", $1 / $2 }')
        echo "$workload	$(basename "$bin")	median $m	ratio $ratio	(runs: $all)"
        index=$((index + 1))
    done
done
