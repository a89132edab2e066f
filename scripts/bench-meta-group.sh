#!/bin/bash
# Metadata rates side by side: the direct path (one node) and a group of three, both
# clusters running at once, benchmarked in alternating rounds (docs/performance.md).
# Usage: scripts/bench-meta-group.sh [DIR]   (release build of `flotilla` first;
# FLOTILLA_BIN=path picks another build, CLIENTS=N and FILES=N change the load,
# ROUNDS=N the rounds; GROUP_CONFIG=FILE starts one more group of three with
# `--config FILE` ("three-configured"), e.g. settings restoring an earlier behaviour, so
# the two groups are compared in the same run; GROUP_CONFIG_BIN=path runs that group from
# another build, e.g. the one before a change)
set -u
cd "$(dirname "$0")/.."
F=${FLOTILLA_BIN:-target/release/flotilla}
D=${1:-/tmp/bench-meta-group}
rm -rf "$D"; mkdir -p "$D"
"$F" local --data "$D/one" --servers 4 > "$D/one.log" 2>&1 &
P1=$!
"$F" local --data "$D/three" --servers 4 --meta-replicas 3 > "$D/three.log" 2>&1 &
P2=$!
NAMES="one three"
P3=
if [ -n "${GROUP_CONFIG:-}" ]; then
  "${GROUP_CONFIG_BIN:-$F}" --config "$GROUP_CONFIG" local --data "$D/three-configured" --servers 4 --meta-replicas 3 \
    > "$D/three-configured.log" 2>&1 &
  P3=$!
  NAMES="one three-configured three"
fi
trap 'kill $P1 $P2 $P3 2>/dev/null; wait' EXIT
sleep 8
for round in $(seq 1 "${ROUNDS:-2}"); do
  for name in $NAMES; do
    addr=$(grep -m1 '^meta=' "$D/$name.log" | cut -d= -f2)
    echo "== round $round $name"
    "$F" bench meta --meta "$addr" --key "$D/$name/keys/client.cred" --clients "${CLIENTS:-4}" --files-per-client "${FILES:-1000}" --runs 3 2>&1 | grep -v '^round'
  done
done
