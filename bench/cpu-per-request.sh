#!/usr/bin/env bash
# Where a request's CPU goes, Keyway against Redis Cluster, in one run: the
# servers' user and system CPU time per request, and what is left of the
# machine for the load generator.
#
# One after the other, each alone on the machine: a 3-master Redis Cluster
# (appendfsync matched to --durability: always by default) and a 3-node
# `keyway dev` (--durability, default group; each --rf in turn). Each is loaded with 200,000 SETs first, then
# measured under `redis-benchmark --cluster -t TEST -n N -c 50 -P P` while
# the servers' CPU (utime, stime of their processes) and the machine's
# (/proc/stat) are read before and after. Prints per system:
#   ops/s, server user us/req, server sys us/req, machine us/req
# where machine us/req is the busy time of all cores per request (server,
# load generator and the rest). With every core busy, what is not the
# servers' is mostly redis-benchmark's own: throughput cannot exceed
# cores / (that + the server's cost), whatever the server does.
#
# usage: bench/cpu-per-request.sh [-t get|set|...] [-P PIPELINE] [-n REQUESTS]
#          [--rf "1 2"] [--durability group|always|periodic|none] [--threads]
#   --rf: Keyway's replication factors, one measured run each (default 1).
#   --durability: Keyway's (default group); Redis's appendfsync is matched
#     to it (group, always -> always; periodic -> everysec; none -> no).
#   --threads: after each Keyway row, its CPU by thread name (kw-exec: the
#     shard threads; kw-syncer; tokio-rt-worker: the shared runtime and its
#     blocking pool, where replication runs; fjall:worker: flushes and
#     compactions), in us per request, and the machine's context switches
#     per request: where factor 2's extra cost goes.
#   KEYWAY_BIN=path uses that keyway binary instead of building the release one.
#   KEYWAY_DEV_ARGS="..." adds flags to `keyway dev` (an A/B of a setting).
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=get; P=1; N=1000000; RFS=1; DUR=group; THREADS=""
while [ $# -gt 0 ]; do
  case "$1" in
    -t) TEST=$2; shift 2;; -P) P=$2; shift 2;; -n) N=$2; shift 2;;
    --rf) RFS=$2; shift 2;;
    --durability) DUR=$2; shift 2;;
    --threads) THREADS=1; shift;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
[[ "$P" =~ ^[0-9]+$ && "$N" =~ ^[0-9]+$ ]] || { echo "-P and -n take positive integers" >&2; exit 2; }
case "$DUR" in group|always) FSYNC=always;; periodic) FSYNC=everysec;; none) FSYNC=no;;
  *) echo "--durability takes group, always, periodic or none" >&2; exit 2;; esac
for rf in $RFS; do
  case "$rf" in 1|2|3) ;; *) echo "--rf takes replication factors 1..3 (3 nodes)" >&2; exit 2;; esac
done
bash scripts/setup.sh
source bench/lib.sh
keyway_binary
WORK=$(mktemp -d)
RPORT=${RPORT:-17101}; KPORT=${KPORT:-17201}
PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT
TICK=$(getconf CLK_TCK)

# The servers' CPU ticks so far: "user system".
server_ticks() {
  local u=0 s=0 f
  for pid in "${PIDS[@]}"; do
    read -r -a f < "/proc/$pid/stat"
    # Fields 14 and 15 (utime, stime); the name (field 2) has no spaces here.
    u=$((u + f[13])); s=$((s + f[14]))
  done
  echo "$u $s"
}
# The machine's busy and total ticks: "busy total".
machine_ticks() {
  local _c u n s i w q sq st
  read -r _c u n s i w q sq st _ < /proc/stat
  echo "$((u + n + s + q + sq + st)) $((u + n + s + i + w + q + sq + st))"
}

# CPU ticks of one process's threads, summed by thread name: "name ticks" lines.
thread_ticks() {
  local t f
  for t in /proc/"$1"/task/*; do
    read -r -a f < "$t/stat" 2>/dev/null || continue
    # The name (field 2, in parentheses) has no spaces in keyway's threads.
    echo "$(cat "$t/comm" 2>/dev/null | tr ' ' _) $((f[13] + f[14]))"
  done | awk '{ a[$1] += $2 } END { for (k in a) print k, a[k] }' | sort
}
context_switches() { awk '/^ctxt/ { print $2 }' /proc/stat; }

measure() { # label port redis|keyway
  redis-benchmark --cluster -p "$2" -t set -n 200000 -c 50 -q > /dev/null 2>&1
  local s0 m0 s1 m1 out ops
  if [ -n "$THREADS" ] && [ "$3" = keyway ]; then
    thread_ticks "${PIDS[0]}" > "$WORK/threads0"; context_switches > "$WORK/ctxt0"
  fi
  s0=$(server_ticks); m0=$(machine_ticks)
  out=$(redis-benchmark --cluster -p "$2" -t "$TEST" -n "$N" -c 50 -P "$P" --csv 2>/dev/null | tr -d '\r"' \
    | grep -E "^${TEST^^}," | cut -d, -f2)
  s1=$(server_ticks); m1=$(machine_ticks)
  if [ -n "$THREADS" ] && [ "$3" = keyway ]; then
    thread_ticks "${PIDS[0]}" > "$WORK/threads1"; context_switches > "$WORK/ctxt1"
  fi
  ops=${out:-0}
  # redis-benchmark --cluster notices the end on a 250 ms tick: short runs
  # overstate their time (the CPU per request is not affected).
  awk -v n="$N" -v ops="$ops" 'BEGIN { if (ops > 0 && n / ops < 5)
    printf "warning: the run took %.2f s: ops/s rounded down by up to 250 ms, raise -n\n", n / ops > "/dev/stderr" }'
  read -r su ss <<< "$s0"; read -r eu es <<< "$s1"
  read -r mb mt <<< "$m0"; read -r nb nt <<< "$m1"
  awk -v label="$1" -v ops="$ops" -v n="$N" -v tick="$TICK" \
      -v u=$((eu - su)) -v s=$((es - ss)) -v busy=$((nb - mb)) -v total=$((nt - mt)) 'BEGIN {
    us = 1e6 / tick / n
    printf "%-32s %12.0f %12.2f %12.2f %12.2f %9.0f%%\n", label, ops, u * us, s * us, busy * us, 100 * busy / total
  }'
  if [ -n "$THREADS" ] && [ "$3" = keyway ]; then
    join -a 2 -e 0 -o 0,1.2,2.2 "$WORK/threads0" "$WORK/threads1" \
      | awk -v n="$N" -v tick="$TICK" -v c=$(( $(cat "$WORK/ctxt1") - $(cat "$WORK/ctxt0") )) '
        { us = ($3 - $2) * 1e6 / tick / n; if (us >= 0.005) line = line sprintf(" %s %.2f", $1, us) }
        END { printf "  threads, us/req:%s; context switches/req (machine): %.2f\n", line, c / n }'
  fi
}

printf '%-32s %12s %12s %12s %12s %10s\n' "redis-benchmark -t $TEST -P $P" ops/s user_us/req sys_us/req machine_us busy
redis_cluster_up "$WORK" "$RPORT" 3 0 "$FSYNC" PIDS
measure "redis 3 masters ($FSYNC)" "$RPORT" redis
stop_all

for rf in $RFS; do
  "$KW" dev --nodes 3 --port "$KPORT" --admin-port $((KPORT+100)) --meta-port $((KPORT-1)) \
    --manager-admin-port $((KPORT+200)) --data "$WORK/keyway-rf$rf" --durability "$DUR" \
    --replication-factor "$rf" ${KEYWAY_DEV_ARGS:-} > "$WORK/keyway.out" 2>&1 &
  PIDS+=($!)
  until grep -q 'Ctrl-C stops' "$WORK/keyway.out" 2>/dev/null; do
    kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$WORK/keyway.out" >&2; exit 1; }; sleep 0.05
  done
  [ "$rf" = 1 ] && keyway_steady "$WORK/keyway-rf$rf" $((KPORT+100)) 3
  measure "keyway rf=$rf ($DUR)" "$KPORT" keyway
  stop_all
done
echo "us/req: CPU time per request; machine_us: all cores' busy time per request (servers, load generator, the rest); busy: share of the cores busy during the run"
