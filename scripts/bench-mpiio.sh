#!/usr/bin/env bash
# MPI-IO benchmark of issue 36 (docs/performance.md, "MPI-IO through libflotilla_mpiio against
# ROMIO ufs: on the mount"): crates/flotilla-mpiio/c/bench/mpiio_bench.c on 4 ranks of MPICH
# (ROMIO), side by side on one `flotilla local` cluster with its FUSE mount:
#   mpiio  flotilla:/bench/f      through libflotilla_mpiio (linked)
#   mount  ufs:MOUNT/bench/f      ROMIO's POSIX driver on the Flotilla mount
#   local  ufs:DIR/f              ROMIO's POSIX driver on local disk (same disk as the cluster)
# each in collective (`coll`: write_all/read_all) and independent (`indep`) form, the sides in
# alternation for ROUNDS rounds; prints every run, then medians (MB/s) and the ratios
# mpiio/mount and mpiio/local. With HDF5=1 also parallel HDF5 (c/bench/hdf5_bench.c, an N^3
# contiguous dataset written and read by hyperslabs, h5pcc.openmpi, Open MPI with ROMIO
# `--mca io romio321`; libflotilla_mpiio preloaded for the flotilla: side) on the same three
# sides. Cleans up (unmount, stop the cluster, delete the data).
# (HDF5=only: the HDF5 part alone). A run that fails or times out (RUN_TIMEOUT_S) is reported
# and left out of the medians.
# Usage: ROUNDS=3 N=256 [HDF5=1|only] scripts/bench-mpiio.sh   (N: cube edge, a multiple of 4; the
#        cube, the record file and the HDF5 dataset are N^3*8 bytes each)
# Debug build (as the tests); needs mpich, libmpich-dev, fuse3 (HDF5=1: openmpi-bin,
# libhdf5-openmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-3}"
n="${N:-256}"
timeout_s="${RUN_TIMEOUT_S:-900}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

hdf5="${HDF5:-0}"
libs="$(scripts/build-mpiio.sh)"
lib="$(echo "$libs" | grep '/mpich/libflotilla_mpiio.so$')"
cargo build -p flotilla-cli
flotilla="$CARGO_TARGET_DIR/debug/flotilla"

work="$(mktemp -d "${BENCH_DIR:-/tmp}/bench-mpiio.XXXXXX")"
mkdir -p "$work/bin" "$work/mnt" "$work/local"
source=crates/flotilla-mpiio/c/bench/mpiio_bench.c
mpicc.mpich -std=c11 -Wall -Wextra -O2 "$source" -o "$work/bin/romio"
mpicc.mpich -std=c11 -Wall -Wextra -O2 "$source" -L "$(dirname "$lib")" -lflotilla_mpiio \
    -Wl,-rpath,"$(dirname "$lib")" -o "$work/bin/flotilla"
if [ "$hdf5" != 0 ]; then
    openmpi_lib="$(echo "$libs" | grep '/openmpi/libflotilla_mpiio.so$')"
    # in $work: h5pcc leaves its object file in the current folder
    (cd "$work" && h5pcc.openmpi -Wall -Werror -O2 "$OLDPWD/crates/flotilla-mpiio/c/bench/hdf5_bench.c" -o bin/hdf5)
fi

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
mpich=(mpiexec.mpich -n 4)
openmpi=(mpirun.openmpi --allow-run-as-root --oversubscribe --mca io romio321 -x FLOTILLA_META -x FLOTILLA_KEY -n 4)
run() { # side program path mode [launcher...]
    local side="$1" program="$2" path="$3" mode="$4"
    shift 4
    [ $# -gt 0 ] || set -- "${mpich[@]}"
    timeout "$timeout_s" "$@" "$work/bin/$program" "$path" "$mode" "$n" |
        while read -r phase mode rate; do
            echo "$side $phase $mode $rate" | tee -a "$results"
        done || echo "$side $program $mode: failed or timed out (left out)"
}
for round in $(seq 1 "$rounds"); do
    echo "round $round (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    for mode in coll indep; do
        if [ "$hdf5" != only ]; then
            run mpiio flotilla "flotilla:/bench/f" "$mode"
            run mount romio "ufs:$work/mnt/bench/f" "$mode"
            run local romio "ufs:$work/local/f" "$mode"
        fi
        if [ "$hdf5" != 0 ]; then
            run mpiio hdf5 "flotilla:/bench/h.h5" "$mode" "${openmpi[@]}" -x LD_PRELOAD="$openmpi_lib"
            run mount hdf5 "ufs:$work/mnt/bench/h.h5" "$mode" "${openmpi[@]}"
            run local hdf5 "ufs:$work/local/h.h5" "$mode" "${openmpi[@]}"
        fi
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
phases="cube_write cube_read records_write"
[ "$hdf5" = only ] && phases=""
[ "$hdf5" != 0 ] && phases="$phases h5_write h5_read"
for phase in $phases; do
    for mode in coll indep; do
        a="$(median mpiio $phase $mode)"
        b="$(median mount $phase $mode)"
        c="$(median local $phase $mode)"
        printf '| %-13s | %-5s | %10s | %10s | %10s | %10.2fx | %10.2fx |\n' "$phase" "$mode" "$a" "$b" "$c" \
            "$(awk -v a="$a" -v b="$b" 'BEGIN {print a/b}')" "$(awk -v a="$a" -v c="$c" 'BEGIN {print a/c}')"
    done
done
