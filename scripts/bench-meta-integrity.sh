#!/usr/bin/env bash
# File creates/s (and the other `flotilla bench meta` phases) with integrity tags on
# (`integrity = "mac"`, the default) and off (`integrity = "none"`), side by side: the two
# settings alternate within every round, each a fresh embedded cluster (`bench meta --runs 1`),
# so both see the same machine load. Prints the medians per phase and the ratio mac / none.
#
# Usage: scripts/bench-meta-integrity.sh [BIN]   (default target/release/flotilla)
# Environment: ROUNDS (default 3), CLIENTS (4), FILES (1000 per client), SERVERS (4), WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/flotilla}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-4}
FILES=${FILES:-1000}
SERVERS=${SERVERS:-4}
WORK=${WORK:-$(pwd)/target/bench-meta-integrity}
rm -rf "$WORK" && mkdir -p "$WORK"
for mode in mac none; do
  printf '[client]\nintegrity = "%s"\n' "$mode" > "$WORK/$mode.toml"
done
for round in $(seq "$ROUNDS"); do
  for mode in mac none; do
    echo "round $round/$ROUNDS: integrity = $mode" >&2
    "$BIN" --config "$WORK/$mode.toml" bench meta --runs 1 --clients "$CLIENTS" \
      --files-per-client "$FILES" --servers "$SERVERS" --json > "$WORK/$mode-$round.json"
  done
done
python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
runs = {m: [json.load(open(f"{work}/{m}-{r}.json")) for r in range(1, rounds + 1)] for m in ("mac", "none")}
print(f"{'phase':<12} {'none ops/s':>12} {'mac ops/s':>12} {'mac/none':>9}   (medians of {rounds} rounds)")
for index, phase in enumerate(runs["mac"][0]["phases"]):
    median = lambda m: statistics.median(r["phases"][index]["flotilla"]["median_ops_per_s"] for r in runs[m])
    none, mac = median("none"), median("mac")
    print(f"{phase['phase']:<12} {none:>12.0f} {mac:>12.0f} {mac / none:>9.2f}")
PY
