#!/bin/bash
# Metadata rates side by side: the direct path (one node) and a group of three, both
# clusters running at once, benchmarked in alternating rounds (docs/performance.md).
# Usage: scripts/bench-meta-group.sh [DIR]   (release build of `flotilla` first;
# FLOTILLA_BIN=path picks another build, CLIENTS=N and FILES=N change the load)
set -u
cd "$(dirname "$0")/.."
F=${FLOTILLA_BIN:-target/release/flotilla}
D=${1:-/tmp/bench-meta-group}
rm -rf "$D"; mkdir -p "$D"
"$F" local --data "$D/one" --servers 4 > "$D/one.log" 2>&1 &
P1=$!
"$F" local --data "$D/three" --servers 4 --meta-replicas 3 > "$D/three.log" 2>&1 &
P2=$!
trap 'kill $P1 $P2 2>/dev/null; wait' EXIT
sleep 8
for round in 1 2; do
  for name in one three; do
    addr=$(grep -m1 '^meta=' "$D/$name.log" | cut -d= -f2)
    echo "== round $round $name"
    "$F" bench meta --meta "$addr" --key "$D/$name/keys/client.cred" --clients "${CLIENTS:-4}" --files-per-client "${FILES:-1000}" --runs 3 2>&1 | grep -v '^round'
  done
done
