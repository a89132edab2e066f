#!/usr/bin/env bash
# Metadata operations through the POSIX mount (mdtest-style), side by side with the local
# disk under it, and with other flotilla binaries (a before/after comparison), in one run.
#
# For each binary given, starts `flotilla local --mount` (a metadata service and 4 I/O
# servers whose targets are on the local disk, mounted through FUSE), then runs
# `flotilla bench meta-tree` over the local disk and every mount: each round runs the same
# workload on each side in turn, so all see the same machine load (4 processes, FILES items
# each in a directory of their own and in a shared one: creates, stats, small writes and
# reads, removals, directory creates, renames, removals). Prints, per phase, the median over
# ROUNDS of the aggregate rate and each mount's ratio to the local disk.
#
# Usage: scripts/bench-mount-meta.sh [BINARY...] (default: target/release/flotilla, built).
# Environment: FILES (per process, default 1000), ROUNDS (default 3), WORK (default
# target/bench-mount-meta). Needs root (FUSE).
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=${FILES:-1000}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-$(pwd)/target/bench-mount-meta}
BINS=("$@")
if [ "${#BINS[@]}" -eq 0 ]; then
    cargo build --release -p flotilla-cli >&2
    BINS=(target/release/flotilla)
fi
rm -rf "$WORK" && mkdir -p "$WORK/local"

PIDS=()
MOUNTS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for mount in "${MOUNTS[@]}"; do
        if grep -q " $mount " /proc/mounts; then "${BINS[0]}" umount --lazy "$mount" || true; fi
    done
}
trap cleanup EXIT
for index in "${!BINS[@]}"; do
    mount="$WORK/mnt$index"
    "${BINS[$index]}" local --data "$WORK/data$index" --listen 127.0.0.1:0 --servers 4 \
        --mount "$mount" > "$WORK/local$index.out" 2> "$WORK/local$index.err" &
    PIDS+=($!)
    MOUNTS+=("$mount")
    for _ in $(seq 1 200); do
        grep -q '^mount=' "$WORK/local$index.out" 2>/dev/null && break
        sleep 0.1
    done
    grep -q '^mount=' "$WORK/local$index.out" || {
        echo "bench-mount-meta: the mount of ${BINS[$index]} did not come up" >&2
        cat "$WORK/local$index.err" >&2
        exit 1
    }
done

SIDES=("local=$WORK/local")
for index in "${!MOUNTS[@]}"; do SIDES+=("flotilla$index=${MOUNTS[$index]}"); done
# The workload is `flotilla bench meta-tree` (the same program measures MooseFS, GlusterFS or
# any other mounted directory); PHASES limits nothing here: every phase is reported.
"${BINS[0]}" bench meta-tree --items "$FILES" --rounds "$ROUNDS" "${SIDES[@]}"
