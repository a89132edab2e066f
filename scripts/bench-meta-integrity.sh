#!/usr/bin/env bash
# File creates/s (and the other `flotilla bench meta` phases) with integrity tags on
# (`integrity = "mac"`, the default), off (`integrity = "none"`) and with encryption
# (`integrity = "encrypt"`), side by side: the settings alternate within every round, each a
# fresh embedded cluster (`bench meta --runs 1`), so all see the same machine load. Prints
# the medians per phase and each setting's ratio to none.
#
# Usage: scripts/bench-meta-integrity.sh [BIN]   (default target/release/flotilla)
# Environment: ROUNDS (default 3), CLIENTS (4), FILES (1000 per client), SERVERS (4), WORK,
# MODES (default "none mac encrypt"; must include none).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/flotilla}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-4}
FILES=${FILES:-1000}
SERVERS=${SERVERS:-4}
WORK=${WORK:-$(pwd)/target/bench-meta-integrity}
MODES=${MODES:-none mac encrypt}
rm -rf "$WORK" && mkdir -p "$WORK"
for mode in $MODES; do
  printf '[client]\nintegrity = "%s"\n' "$mode" > "$WORK/$mode.toml"
done
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    echo "round $round/$ROUNDS: integrity = $mode" >&2
    "$BIN" --config "$WORK/$mode.toml" bench meta --runs 1 --clients "$CLIENTS" \
      --files-per-client "$FILES" --servers "$SERVERS" --json > "$WORK/$mode-$round.json"
  done
done
python3 - "$WORK" "$ROUNDS" $MODES <<'PY'
import json, statistics, sys
work, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = {m: [json.load(open(f"{work}/{m}-{r}.json")) for r in range(1, rounds + 1)] for m in modes}
others = [m for m in modes if m != "none"]
head = f"{'phase':<12}" + "".join(f" {m + ' ops/s':>14}" for m in modes) + "".join(f" {m + '/none':>13}" for m in others)
print(head + f"   (medians of {rounds} rounds)")
for index, phase in enumerate(runs["none"][0]["phases"]):
    median = lambda m: statistics.median(r["phases"][index]["flotilla"]["median_ops_per_s"] for r in runs[m])
    values = {m: median(m) for m in modes}
    row = f"{phase['phase']:<12}" + "".join(f" {values[m]:>14.0f}" for m in modes)
    print(row + "".join(f" {values[m] / values['none']:>13.2f}" for m in others))
PY
