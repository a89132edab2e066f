#!/usr/bin/env bash
# The cost of metrics and job statistics, side by side in one run: "off" runs the servers with
# `[server] metrics = false` (nothing counted) and no job id; "on" runs them with metrics
# counted (the default) and every client naming its job (FLOTILLA_JOB), so each request is
# also counted under the job. The two alternate inside every round so both see the same
# machine load (in ABBA order). Measures 1 MiB sequential reads and writes through the library (`bench gpfs`,
# 2 servers, 2 clients) and the 64-byte interleaved strided read (`bench interleaved`).
#
# Usage: scripts/bench-ops-cost.sh [BIN]   (default target/release/flotilla)
# Environment: ROUNDS (default 3), WORK (default target/bench-ops-cost).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/flotilla}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-$(pwd)/target/bench-ops-cost}
MODES="off on"
rm -rf "$WORK" && mkdir -p "$WORK"
printf '[server]\nmetrics = false\n' > "$WORK/off.toml"
printf '[server]\nmetrics = true\n' > "$WORK/on.toml"
run() { # MODE ARGS...: one benchmark in MODE
  local mode=$1; shift
  if [ "$mode" = on ]; then
    FLOTILLA_JOB=bench-ops-cost "$BIN" --config "$WORK/$mode.toml" "$@"
  else
    env -u FLOTILLA_JOB -u SLURM_JOB_ID "$BIN" --config "$WORK/$mode.toml" "$@"
  fi
}
for round in $(seq "$ROUNDS"); do
  # ABBA order: a run that follows another (e.g. while its writes still drain to disk) is
  # "on" in odd rounds and "off" in even ones, so that handicap falls on both alike.
  order=$MODES
  if [ $((round % 2)) -eq 0 ]; then order="on off"; fi
  for op in read write; do
    for mode in $order; do
      echo "round $round/$ROUNDS: 1 MiB $op, metrics $mode" >&2
      run "$mode" bench gpfs --pattern segmented --transfer 1m --op "$op" \
        --servers 2 --clients 2 --bytes-per-server 64m --runs 1 --json > "$WORK/$op-$mode-$round.json"
    done
  done
  for mode in $order; do
    echo "round $round/$ROUNDS: interleaved, metrics $mode" >&2
    run "$mode" bench interleaved --runs 1 --json > "$WORK/interleaved-$mode-$round.json"
  done
done
python3 - "$WORK" "$ROUNDS" $MODES <<'PY'
import json, statistics, sys
work, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rows(doc):
    """(mode label, MB/s) of every point of a bench --json document."""
    return [(p.get("mode", ""), p["median_bytes_per_s"] / 1e6) for p in (doc.get("points") or [doc])]
table = {}
for kind in ("read", "write", "interleaved"):
    for mode in modes:
        for r in range(1, rounds + 1):
            doc = json.load(open(f"{work}/{kind}-{mode}-{r}.json"))
            for label, value in rows(doc):
                name = f"1 MiB {kind}s" if kind != "interleaved" else f"interleaved {label}"
                table.setdefault(name, {}).setdefault(mode, []).append(value)
print(f"{'benchmark':<26} {'off':>9} {'on':>9} {'on/off':>7}   (MB/s, medians of {rounds} rounds; rounds off | on)")
for name, by_mode in table.items():
    med = {m: statistics.median(by_mode[m]) for m in modes}
    each = " ".join(f"{v:.0f}" for v in by_mode["off"]) + " | " + " ".join(f"{v:.0f}" for v in by_mode["on"])
    print(f"{name:<26} {med['off']:>9.2f} {med['on']:>9.2f} {med['on'] / med['off']:>7.3f}   {each}")
PY
