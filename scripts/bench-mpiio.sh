#!/usr/bin/env bash
# MPI-IO benchmark of issue 36 (docs/performance.md, "MPI-IO through libflotilla_mpiio against
# ROMIO ufs: on the mount"): crates/flotilla-mpiio/c/bench/mpiio_bench.c on 4 ranks of MPICH
# (ROMIO), side by side on one `flotilla local` cluster with its FUSE mount:
#   mpiio  flotilla:/bench/f      through libflotilla_mpiio (linked)
#   mount  ufs:MOUNT/bench/f      ROMIO's POSIX driver on the Flotilla mount
#   local  ufs:DIR/f              ROMIO's POSIX driver on local disk (same disk as the cluster)
# each in collective (`coll`: write_all/read_all) and independent (`indep`) form, the sides in
# alternation for ROUNDS rounds; prints every run, then medians (MB/s) and the ratios
# mpiio/mount and mpiio/local. Cleans up (unmount, stop the cluster, delete the data).
# Usage: ROUNDS=3 N=256 scripts/bench-mpiio.sh      (N: cube edge, a multiple of 4; the cube
#        and the record file are N^3*8 bytes each)
# Debug build (as the tests); needs mpich, libmpich-dev, fuse3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-3}"
n="${N:-256}"
timeout_s="${RUN_TIMEOUT_S:-900}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

lib="$(scripts/build-mpiio.sh | grep '/mpich/libflotilla_mpiio.so$')"
cargo build -p flotilla-cli
flotilla="$CARGO_TARGET_DIR/debug/flotilla"

work="$(mktemp -d "${BENCH_DIR:-/tmp}/bench-mpiio.XXXXXX")"
mkdir -p "$work/bin" "$work/mnt" "$work/local"
source=crates/flotilla-mpiio/c/bench/mpiio_bench.c
mpicc.mpich -std=c11 -Wall -Wextra -O2 "$source" -o "$work/bin/romio"
mpicc.mpich -std=c11 -Wall -Wextra -O2 "$source" -L "$(dirname "$lib")" -lflotilla_mpiio \
    -Wl,-rpath,"$(dirname "$lib")" -o "$work/bin/flotilla"

cluster=""
cleanup() {
    if mountpoint -q "$work/mnt"; then fusermount3 -u "$work/mnt" 2>/dev/null || umount -l "$work/mnt" || true; fi
    if [ -n "$cluster" ]; then
        kill -INT "$cluster" 2>/dev/null || true
        wait "$cluster" 2>/dev/null || true
    fi
    mountpoint -q "$work/mnt" && umount -l "$work/mnt"
    rm -rf "$work"
}
trap cleanup EXIT

"$flotilla" local --data "$work/data" --mount "$work/mnt" --listen 127.0.0.1:0 >"$work/local.log" 2>&1 &
cluster=$!
for _ in $(seq 1 600); do
    if grep -q '^key=' "$work/local.log" && mountpoint -q "$work/mnt"; then break; fi
    kill -0 "$cluster" 2>/dev/null || { cat "$work/local.log" >&2; exit 1; }
    sleep 0.1
done
meta="$(sed -n 's/^meta=//p' "$work/local.log" | head -1)"
key="$(sed -n 's/^key=//p' "$work/local.log" | head -1)"
[ -n "$meta" ] && [ -n "$key" ] && mountpoint -q "$work/mnt" || { cat "$work/local.log" >&2; exit 1; }
export FLOTILLA_META="$meta" FLOTILLA_KEY="$key"
mkdir "$work/mnt/bench"

echo "bench-mpiio: N=$n ($((n * n * n * 8 / 1048576)) MiB per file), $rounds rounds, cluster $meta, mount $work/mnt"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
results="$work/results"
: >"$results"
run() { # side program path mode
    timeout "$timeout_s" mpiexec.mpich -n 4 "$work/bin/$2" "$3" "$4" "$n" |
        while read -r phase mode rate; do
            echo "$1 $phase $mode $rate" | tee -a "$results"
        done
}
for round in $(seq 1 "$rounds"); do
    echo "round $round (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    for mode in coll indep; do
        run mpiio flotilla "flotilla:/bench/f" "$mode"
        run mount romio "ufs:$work/mnt/bench/f" "$mode"
        run local romio "ufs:$work/local/f" "$mode"
    done
done

echo
echo "medians over $rounds rounds, MB/s (10^6 bytes/s of the whole file); load average $(cut -d' ' -f1-3 /proc/loadavg)"
median() { # side phase mode
    awk -v s="$1" -v p="$2" -v m="$3" '$1==s && $2==p && $3==m {print $4}' "$results" | sort -g |
        awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'
}
printf '| %-13s | %-5s | %10s | %10s | %10s | %11s | %11s |\n' phase mode mpiio mount local mpiio/mount mpiio/local
printf '|%s|\n' "---------------|-------|------------|------------|------------|-------------|------------"
for phase in cube_write cube_read records_write; do
    for mode in coll indep; do
        a="$(median mpiio $phase $mode)"
        b="$(median mount $phase $mode)"
        c="$(median local $phase $mode)"
        printf '| %-13s | %-5s | %10s | %10s | %10s | %10.2fx | %10.2fx |\n' "$phase" "$mode" "$a" "$b" "$c" \
            "$(awk -v a="$a" -v b="$b" 'BEGIN {print a/b}')" "$(awk -v a="$a" -v c="$c" 'BEGIN {print a/c}')"
    done
done
