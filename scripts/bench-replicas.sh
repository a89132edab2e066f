#!/bin/bash
# Replicated files against plain ones, side by side on one cluster (issue 32,
# docs/performance.md): a metadata service and four I/O servers on loopback, each server in
# its own failure group; in every round the same 256 MiB local file is put (and then got)
# once with `--layout stripe:1m:4` (replicas=1: four subfiles, one per server) and once
# with `stripe:1m:2,replicas=2` (two subfiles on chains with disjoint members: again all
# four servers; four disjoint chains of two need eight targets), the order alternating
# between rounds; the machine's dirty pages are flushed (untimed) between a put and its get.
# Prints every time, the medians and the ratios.
# Usage: scripts/bench-replicas.sh [DIR] [ROUNDS] [SIZE_MIB]
#   FLOTILLA_BIN: the binary (default target/debug/flotilla; build it first).
#   CHAIN_WINDOW: the servers' `chain_window_max` (default 64; 1 is the unpipelined head).
set -u
cd "$(dirname "$0")/.."
F=${FLOTILLA_BIN:-${CARGO_TARGET_DIR:-target}/debug/flotilla}
D=${1:-/tmp/bench-replicas}
ROUNDS=${2:-5}
MIB=${3:-256}
rm -rf "$D"; mkdir -p "$D"
"$F" keygen --out "$D/keys" > /dev/null || exit 1
PORT=$((20000 + RANDOM % 20000))
META=127.0.0.1:$PORT
cat > "$D/flotilla.toml" <<EOF
[meta]
key = "$D/keys/server.cred"
chains_per_target = 4
chain_replicas = 2

[server]
key = "$D/keys/server.cred"
chain_window_max = ${CHAIN_WINDOW:-64}

[client]
key = "$D/keys/client.cred"
EOF
PIDS=()
stop() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait; }
trap stop EXIT
"$F" --config "$D/flotilla.toml" meta --data "$D/meta" --listen "$META" > "$D/meta.log" 2>&1 &
PIDS+=($!)
sleep 2
for i in 0 1 2 3; do
  mkdir -p "$D/target-$i"
  "$F" --config "$D/flotilla.toml" server --meta "$META" --target "$D/target-$i" \
    --listen 127.0.0.1:0 --failure-group "group-$i" > "$D/server-$i.log" 2>&1 &
  PIDS+=($!)
done
FL=("$F" --config "$D/flotilla.toml")
# Every chain serving (no member offline or syncing) before the first round.
for _ in $(seq 1 100); do
  S=$("${FL[@]}" status --chains --meta "$META" 2>/dev/null)
  if [ "$(echo "$S" | grep -c '^target=')" -ge 4 ] && echo "$S" | grep -q '^chain=' \
     && ! echo "$S" | grep '^chain=' | grep -qE 'offline|syncing'; then
    break
  fi
  sleep 0.3
done
echo "$S" | grep '^chain=' | head -3
head -c $((MIB << 20)) /dev/urandom > "$D/input"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
declare -A W R
for round in $(seq 1 "$ROUNDS"); do
  order="1 2"; [ $((round % 2)) -eq 0 ] && order="2 1"
  for n in $order; do
    layout="stripe:1m:4"; [ "$n" = 2 ] && layout="stripe:1m:2,replicas=2"
    t0=$(ms)
    "${FL[@]}" put --meta "$META" --layout "$layout" "$D/input" "/r$n-$round" || exit 1
    t1=$(ms)
    # The machine's dirty pages (the write just made: twice the bytes for replicas=2, on
    # the one disk every server shares) are flushed, untimed, before the read: else their
    # writeback competes with it and the layout written last reads slower.
    sync
    t1r=$(ms)
    "${FL[@]}" get --meta "$META" "/r$n-$round" "$D/output" || exit 1
    t2=$(ms)
    cmp -s "$D/input" "$D/output" || { echo "replicas=$n round $round: read back differs"; exit 1; }
    rm -f "$D/output"
    W[$n]="${W[$n]:-} $((t1 - t0))"; R[$n]="${R[$n]:-} $((t2 - t1r))"
    echo "round $round replicas=$n write $((t1 - t0)) ms read $((t2 - t1r)) ms"
    "${FL[@]}" rm --meta "$META" "/r$n-$round" > /dev/null 2>&1
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for n in 1 2; do
  wm=$(echo "${W[$n]}" | median); rm_=$(echo "${R[$n]}" | median)
  echo "replicas=$n: $MIB MiB write median $wm ms ($(awk "BEGIN {printf \"%.0f\", $MIB * 1000 / $wm}") MiB/s), read median $rm_ ms ($(awk "BEGIN {printf \"%.0f\", $MIB * 1000 / $rm_}") MiB/s)"
  eval "WM$n=$wm RM$n=$rm_"
done
awk "BEGIN {printf \"ratio replicas=2 / replicas=1 (throughput): write %.2f, read %.2f\n\", $WM1 / $WM2, $RM1 / $RM2}"
