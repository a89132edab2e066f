#!/usr/bin/env bash
# Metadata operations through the POSIX mount (mdtest-style), side by side with the local
# disk under it, and with other flotilla binaries (a before/after comparison), in one run.
#
# For each binary given, starts `flotilla local --mount` (a metadata service and 4 I/O
# servers whose targets are on the local disk, mounted through FUSE). Each round runs the same
# workload in a directory on the local disk and then on each mount, one after the other, so
# all see the same machine load: 4 processes, each in a directory of its own, create FILES
# empty files (open with O_CREAT|O_EXCL, close), stat them, and remove them. Prints, per
# phase, the median over ROUNDS of the aggregate rate (operations of all processes over the
# slowest process's time), and each mount's ratio to the local disk.
#
# Usage: scripts/bench-mount-meta.sh [BINARY...] (default: target/release/flotilla, built).
# Environment: FILES (per process, default 1000), ROUNDS (default 3), WORK (default
# target/bench-mount-meta). Needs root (FUSE) and python3.
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

SIDES=("$WORK/local" "${MOUNTS[@]}")
NAMES=(local "${BINS[@]}")
python3 - "$FILES" "$ROUNDS" "${SIDES[@]}" -- "${NAMES[@]}" <<'EOF'
import multiprocessing as mp, os, statistics, sys, time

files, rounds = int(sys.argv[1]), int(sys.argv[2])
split = sys.argv.index("--")
sides, names = sys.argv[3:split], sys.argv[split + 1:]
PROCESSES = 4
PHASES = ("create", "stat", "remove")

def worker(directory, start, results):
    os.mkdir(directory)
    paths = [os.path.join(directory, f"f{i}") for i in range(files)]
    times = []
    start.wait()
    began = time.perf_counter()
    for path in paths:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    times.append(time.perf_counter() - began)
    start.wait()
    began = time.perf_counter()
    for path in paths:
        os.stat(path)
    times.append(time.perf_counter() - began)
    start.wait()
    began = time.perf_counter()
    for path in paths:
        os.unlink(path)
    times.append(time.perf_counter() - began)
    os.rmdir(directory)
    results.put(times)

def run(side, round_number):
    start, results = mp.Barrier(PROCESSES), mp.Queue()
    workers = [mp.Process(target=worker, args=(os.path.join(side, f"r{round_number}p{p}"), start, results))
               for p in range(PROCESSES)]
    for w in workers:
        w.start()
    times = [results.get(timeout=3600) for _ in workers]
    for w in workers:
        w.join()
        if w.exitcode != 0:
            sys.exit(f"a worker on {side} failed")
    return [PROCESSES * files / max(t[phase] for t in times) for phase in range(len(PHASES))]

rates = {name: [] for name in names}
for round_number in range(rounds):
    for side, name in zip(sides, names):
        rates[name].append(run(side, round_number))
        print(f"round {round_number + 1} {name}: " + ", ".join(
            f"{phase} {rate:,.0f}/s" for phase, rate in zip(PHASES, rates[name][-1])), flush=True)
print(f"\nmedians of {rounds} rounds, {PROCESSES} processes x {files} files, operations/s:")
medians = {name: [statistics.median(r[p] for r in rates[name]) for p in range(len(PHASES))] for name in names}
print("| side | " + " | ".join(PHASES) + " |")
for name in names:
    ratio = "" if name == "local" else " (" + ", ".join(
        f"{m / l:.3f}" for m, l in zip(medians[name], medians["local"])) + " of local)"
    print(f"| {name} | " + " | ".join(f"{m:,.0f}" for m in medians[name]) + f" |{ratio}")
EOF
