#!/usr/bin/env bash
# Builds libflotilla_mpiio.so for each MPI installed (docs/mpi-io.md): the Rust core
# (libflotilla_mpiio_core.so, crates/flotilla-mpiio) once, then the C shim
# crates/flotilla-mpiio/c/flotilla_mpiio.c with each MPI's own compiler, into
#   target/<profile>/mpiio/mpich/libflotilla_mpiio.so    (mpicc.mpich)
#   target/<profile>/mpiio/openmpi/libflotilla_mpiio.so  (mpicc.openmpi)
# Usage: scripts/build-mpiio.sh [--release]
# Debian: apt-get install mpich libmpich-dev openmpi-bin libopenmpi-dev
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
cargo_args=()
if [ "${1:-}" = "--release" ]; then
    profile=release
    cargo_args+=(--release)
fi
cargo build -p flotilla-mpiio "${cargo_args[@]}"
target="${CARGO_TARGET_DIR:-target}/$profile"
core="$(cd "$target" && pwd)"
built=0
for mpi in mpich openmpi; do
    if ! command -v "mpicc.$mpi" >/dev/null 2>&1; then
        echo "build-mpiio: mpicc.$mpi not found, skipping $mpi" >&2
        continue
    fi
    mkdir -p "$core/mpiio/$mpi"
    "mpicc.$mpi" -std=c11 -Wall -Wextra -O2 -shared -fPIC crates/flotilla-mpiio/c/flotilla_mpiio.c \
        -L "$core" -lflotilla_mpiio_core -Wl,-rpath,"$core" -o "$core/mpiio/$mpi/libflotilla_mpiio.so"
    echo "$core/mpiio/$mpi/libflotilla_mpiio.so"
    built=$((built + 1))
done
if [ "$built" -eq 0 ]; then
    echo "build-mpiio: no MPI found (apt-get install mpich libmpich-dev openmpi-bin libopenmpi-dev)" >&2
    exit 1
fi
