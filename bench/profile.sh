#!/usr/bin/env bash
# Where a node's time goes under load: a flame graph and the hottest
# functions of a 3-node `keyway dev` while `redis-benchmark --cluster` runs.
#
# Starts `keyway dev` (release build, or KEYWAY_BIN), drives it with
# `redis-benchmark --cluster -t TEST` for the whole recording, records the
# dev process with `perf record` (DWARF call graphs: the release profile
# keeps line tables, not frame pointers), and writes into --out:
#   profile.svg     the flame graph (inferno; installed into target/tools
#                   by this script the first time, with cargo);
#   folded.txt      the collapsed stacks the graph was drawn from;
#   top.txt         the functions with the most samples of their own;
#   benchmark.txt   what redis-benchmark printed (the load it measured).
# Prints top.txt's first lines and the graph's path. perf must be allowed to
# record the process (kernel.perf_event_paranoid <= 2 for one's own).
#
# usage: bench/profile.sh [-t set|get|...] [-P PIPELINE] [-c CLIENTS]
#          [--seconds S] [--rf N] [--durability group|periodic|none]
#          [--freq HZ] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=set; P=1; C=50; SECONDS_=10; RF=1; DUR=group; FREQ=499; OUT=target/profile
while [ $# -gt 0 ]; do
  case "$1" in
    -t) TEST=$2; shift 2;; -P) P=$2; shift 2;; -c) C=$2; shift 2;;
    --seconds) SECONDS_=$2; shift 2;;
    --rf) RF=$2; shift 2;;
    --durability) DUR=$2; shift 2;;
    --freq) FREQ=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
case "$RF" in 1|2|3) ;; *) echo "--rf takes 1..3 (3 nodes)" >&2; exit 2;; esac
case "$DUR" in group|periodic|none) ;; *) echo "--durability takes group, periodic or none" >&2; exit 2;; esac
[[ "$SECONDS_" =~ ^[0-9]+$ ]] && [ "$SECONDS_" -gt 0 ] || { echo "--seconds must be a positive integer" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }
bash scripts/setup.sh
TOOLS=$PWD/target/tools
if [ ! -x "$TOOLS/bin/inferno-flamegraph" ]; then
  echo "profile: installing inferno into $TOOLS (once)" >&2
  cargo install inferno --locked --quiet --root "$TOOLS"
fi
source bench/lib.sh
keyway_binary
mkdir -p "$OUT"
WORK=$(mktemp -d)
KPORT=${KPORT:-17301}
KW_PID=""; BENCH_PID=""
cleanup() {
  [ -n "$BENCH_PID" ] && kill "$BENCH_PID" 2>/dev/null || true
  if [ -n "$KW_PID" ]; then kill -INT "$KW_PID" 2>/dev/null || true; wait "$KW_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
"$KW" dev --nodes 3 --port $KPORT --admin-port $((KPORT+100)) --meta-port $((KPORT-1)) \
  --manager-admin-port $((KPORT+200)) --data "$WORK/data" --durability "$DUR" \
  --replication-factor "$RF" > "$WORK/dev.out" 2>&1 &
KW_PID=$!
until grep -q 'Ctrl-C stops' "$WORK/dev.out" 2>/dev/null; do
  kill -0 $KW_PID 2>/dev/null || { cat "$WORK/dev.out" >&2; exit 1; }; sleep 0.05
done
# A load that outlasts the recording: stopped once perf is done.
redis-benchmark --cluster -p $KPORT -t "$TEST" -n 1000000000 -c "$C" -P "$P" -r 1000000 \
  > "$OUT/benchmark.txt" 2>&1 &
BENCH_PID=$!
# Let the clients connect and the caches warm before recording.
until grep -q "rps=" "$OUT/benchmark.txt" 2>/dev/null; do
  kill -0 $BENCH_PID 2>/dev/null || { cat "$OUT/benchmark.txt" >&2; exit 1; }; sleep 0.1
done
echo "profile: recording keyway dev (pid $KW_PID) for ${SECONDS_}s under redis-benchmark -t $TEST -P $P -c $C, rf $RF, durability $DUR" >&2
perf record -q -F "$FREQ" --call-graph dwarf,16384 -p "$KW_PID" -o "$WORK/perf.data" -- sleep "$SECONDS_" 2>/dev/null
kill "$BENCH_PID" 2>/dev/null || true; wait "$BENCH_PID" 2>/dev/null || true; BENCH_PID=""
perf script -i "$WORK/perf.data" 2>/dev/null | "$TOOLS/bin/inferno-collapse-perf" > "$OUT/folded.txt"
"$TOOLS/bin/inferno-flamegraph" --title "keyway dev: redis-benchmark -t $TEST -P $P -c $C, rf $RF, $DUR" \
  < "$OUT/folded.txt" > "$OUT/profile.svg"
perf report -i "$WORK/perf.data" --no-children --stdio --sort symbol --percent-limit 0.5 2>/dev/null \
  | grep -E "^ +[0-9.]+%" | sed -E "s/ +-? +-? *$//; s/ {2,}/ /g" > "$OUT/top.txt" || true
echo "last rate redis-benchmark printed: $(tr '\r' '\n' < "$OUT/benchmark.txt" | grep -o 'overall: [0-9.]*' | tail -1)"
head -25 "$OUT/top.txt"
echo "flame graph: $OUT/profile.svg (stacks: $OUT/folded.txt)"
