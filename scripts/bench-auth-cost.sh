#!/usr/bin/env bash
# The cost of authentication, side by side in one run: every connection is authenticated in
# all three settings; they differ in what protects each frame after the handshake —
# `integrity = "none"` (CRC32C only), `"mac"` (BLAKE3 keyed tag, the default) and
# `"encrypt"` (AES-256-GCM). The settings alternate inside every round so all see the same
# machine load. Measures 1 MiB sequential reads and writes through the library (`bench gpfs`,
# 2 servers, 2 clients), the 64-byte interleaved strided read (`bench interleaved`), and
# file creates/stats/removes per second (`bench meta`, via scripts/bench-meta-integrity.sh).
#
# Usage: scripts/bench-auth-cost.sh [BIN]   (default target/release/flotilla)
# Environment: ROUNDS (default 3), WORK (default target/bench-auth-cost).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/flotilla}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-$(pwd)/target/bench-auth-cost}
MODES="none mac encrypt"
rm -rf "$WORK" && mkdir -p "$WORK"
for mode in $MODES; do
  printf '[client]\nintegrity = "%s"\n' "$mode" > "$WORK/$mode.toml"
done
for round in $(seq "$ROUNDS"); do
  for op in read write; do
    for mode in $MODES; do
      echo "round $round/$ROUNDS: 1 MiB $op, integrity = $mode" >&2
      "$BIN" --config "$WORK/$mode.toml" bench gpfs --pattern segmented --transfer 1m --op "$op" \
        --servers 2 --clients 2 --bytes-per-server 64m --runs 1 --json > "$WORK/$op-$mode-$round.json"
    done
  done
  for mode in $MODES; do
    echo "round $round/$ROUNDS: interleaved, integrity = $mode" >&2
    "$BIN" --config "$WORK/$mode.toml" bench interleaved --runs 1 --json > "$WORK/interleaved-$mode-$round.json"
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
print(f"{'benchmark':<26}" + "".join(f" {m:>9}" for m in modes) + "".join(f" {m + '/none':>13}" for m in modes[1:]) + f"   (MB/s, medians of {rounds} rounds)")
for name, by_mode in table.items():
    med = {m: statistics.median(by_mode[m]) for m in modes}
    print(f"{name:<26}" + "".join(f" {med[m]:>9.2f}" for m in modes) + "".join(f" {med[m] / med['none']:>13.2f}" for m in modes[1:]))
PY
ROUNDS=$ROUNDS WORK="$WORK/meta" MODES="$MODES" scripts/bench-meta-integrity.sh "$BIN"
