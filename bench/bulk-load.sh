#!/usr/bin/env bash
# Bulk load and footprint of Keyway against Redis Cluster on this machine, in one run.
#
# One after the other (never both at once): a 3-master Redis Cluster (Debian
# redis-server, AOF on, `appendfsync --fsync`, no replicas) and a 3-node
# `keyway dev` (durability matched: always -> group, everysec -> periodic,
# no -> none; replication factor --rf). For each, --keys SET commands of
# --value-size bytes are written as RESP, one file per owning node (the
# owner of each key's slot, from CLUSTER SLOTS), and piped into all nodes at
# once with `redis-cli --pipe` (never `redis-benchmark --cluster`, which
# puts all of a node's keys in one slot). Prints the load rate (keys over
# the wall time of the slowest pipe), then, once the disk use has settled
# (no change for 5 s, at most --settle-s), resident memory (VmRSS of the
# processes), Redis's `used_memory`, and disk use (du of the data
# directories), with Keyway's ratio to Redis and its disk use against the
# logical data (keys + values), and where Keyway's storage memory is (block
# cache held and capacity, memtables; keyway_storage_* on /metrics).
#
# usage: bench/bulk-load.sh [--keys N] [--value-size BYTES] [--fsync always|everysec|no]
#          [--rf 1|2|3] [--settle-s S]
#   KEYWAY_BIN=path uses that keyway binary instead of building the release one.
#   KEYWAY_DEV_ARGS="..." adds flags to `keyway dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=1000000; VSIZE=100; FSYNC=everysec; RF=1; SETTLE=120
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) KEYS=$2; shift 2;; --value-size) VSIZE=$2; shift 2;;
    --fsync) FSYNC=$2; shift 2;; --rf) RF=$2; shift 2;;
    --settle-s) SETTLE=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
case "$FSYNC" in always) KW_DUR=group;; everysec) KW_DUR=periodic;; no) KW_DUR=none;; *) echo "bad --fsync" >&2; exit 2;; esac
case "$RF" in 1|2|3) ;; *) echo "--rf takes 1..3 (3 nodes)" >&2; exit 2;; esac
[[ "$KEYS" =~ ^[0-9]+$ ]] && [ "$KEYS" -gt 0 ] || { echo "--keys must be a positive integer" >&2; exit 2; }
[[ "$VSIZE" =~ ^[0-9]+$ ]] && [ "$VSIZE" -gt 0 ] || { echo "--value-size must be a positive integer" >&2; exit 2; }
bash scripts/setup.sh
source bench/lib.sh
keyway_binary
WORK=$(mktemp -d)
RPORT=${RPORT:-17501}; KPORT=${KPORT:-17601}
REDIS_PIDS=(); KW_PID=""
stop_redis() {
  for pid in "${REDIS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${REDIS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  REDIS_PIDS=()
}
stop_keyway() {
  if [ -n "$KW_PID" ]; then
    kill -INT "$KW_PID" 2>/dev/null || true
    wait "$KW_PID" 2>/dev/null || true
    KW_PID=""
  fi
}
cleanup() { stop_redis; stop_keyway; rm -rf "$WORK"; }
trap cleanup EXIT

# RESP files, one per node of the cluster at $1 (named by the node's port).
write_resp() {
  python3 - "$1" "$KEYS" "$VSIZE" "$2" <<'EOF'
import binascii, sys
import redis
port, keys, vsize, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
owner = [None] * 16384
for start, end, master, *_ in redis.Redis(port=int(port)).execute_command("CLUSTER SLOTS"):
    for s in range(int(start), int(end) + 1):
        owner[s] = str(int(master[1]))
assert all(o is not None for o in owner), "CLUSTER SLOTS left slots without an owner"
files = {}
value = b"x" * vsize
for k in range(keys):
    key = b"key:%d" % k
    s = binascii.crc_hqx(key, 0) % 16384  # Redis's CRC16 (XMODEM); no hash tags
    f = files.get(owner[s])
    if f is None:
        f = files[owner[s]] = open(f"{out}/load-{owner[s]}.resp", "wb")
    f.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, vsize, value))
for f in files.values():
    f.close()
print(" ".join(sorted(files)))
EOF
}

# Pipes every file at once; prints the wall time in seconds.
load() { # dir ports...
  local dir=$1; shift
  local t0 t1 pids=() rc=0
  t0=$(date +%s.%N)
  for p in "$@"; do
    redis-cli -p "$p" --pipe < "$dir/load-$p.resp" > "$dir/pipe-$p.out" 2>&1 & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  t1=$(date +%s.%N)
  for p in "$@"; do
    grep -q 'errors: 0' "$dir/pipe-$p.out" || { echo "redis-cli --pipe to $p reported errors:" >&2; cat "$dir/pipe-$p.out" >&2; rc=1; }
  done
  [ $rc = 0 ] || exit 1
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}

rss_kib() { # pids... -> summed VmRSS in KiB
  local total=0 kb
  for pid in "$@"; do
    kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
    total=$((total + kb))
  done
  echo $total
}

# Waits until du of the paths is unchanged for 5 s (at most $SETTLE s); prints KiB.
settled_du() {
  local last=-1 same=0 now waited=0
  while :; do
    now=$(du -sck "$@" | tail -1 | cut -f1)
    if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi
    last=$now
    if [ $same -ge 5 ] || [ $waited -ge "$SETTLE" ]; then echo "$now"; return; fi
    sleep 1; waited=$((waited + 1))
  done
}

# Redis Cluster: 3 masters, stopped by PID.
addrs=(); rports=()
for i in 0 1 2; do
  d="$WORK/redis-$i"; mkdir -p "$d"
  redis-server --port $((RPORT+i)) --cluster-enabled yes --cluster-config-file "$d/nodes.conf" \
    --dir "$d" --appendonly yes --appendfsync "$FSYNC" --save '' --logfile "$d/log" >/dev/null &
  REDIS_PIDS+=($!)
  addrs+=("127.0.0.1:$((RPORT+i))"); rports+=($((RPORT+i)))
done
for p in "${rports[@]}"; do until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.05; done; done
redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
until redis-cli -p $RPORT cluster info | grep -q 'cluster_state:ok'; do sleep 0.05; done
mkdir -p "$WORK/r"
read -r -a rowners <<< "$(write_resp $RPORT "$WORK/r")"
echo "loading $KEYS keys of $VSIZE bytes; Redis appendfsync $FSYNC vs Keyway durability $KW_DUR, replication factor $RF" >&2
R_SECS=$(load "$WORK/r" "${rowners[@]}")
R_DU=$(settled_du "$WORK"/redis-*)
R_RSS=$(rss_kib "${REDIS_PIDS[@]}")
R_USED=0
for p in "${rports[@]}"; do
  u=$(redis-cli -p "$p" info memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
  R_USED=$((R_USED + u))
done
R_KEYS=0
for p in "${rports[@]}"; do R_KEYS=$((R_KEYS + $(redis-cli -p "$p" dbsize))); done
stop_redis
rm -rf "$WORK/r" "$WORK"/redis-*

d="$WORK/keyway"
"$KW" dev --nodes 3 --port $KPORT --admin-port $((KPORT+100)) --meta-port $((KPORT-1)) \
  --manager-admin-port $((KPORT+200)) --data "$d" --durability "$KW_DUR" \
  --replication-factor "$RF" ${KEYWAY_DEV_ARGS:-} > "$WORK/keyway.out" 2>&1 &
KW_PID=$!
until grep -q 'Ctrl-C stops' "$WORK/keyway.out" 2>/dev/null; do
  kill -0 $KW_PID 2>/dev/null || { cat "$WORK/keyway.out"; exit 1; }; sleep 0.05
done
[ "$RF" = 1 ] && keyway_steady "$d" $((KPORT+100)) 3
mkdir -p "$WORK/k"
read -r -a kowners <<< "$(write_resp $KPORT "$WORK/k")"
K_SECS=$(load "$WORK/k" "${kowners[@]}")
K_DU=$(settled_du "$d")
K_RSS=$(rss_kib $KW_PID)
# Where the storage memory is, read from /metrics (INFO memory would scan
# the keys first and fill the cache it reports), beside the RSS.
read -r K_CACHE K_CACHE_CAP K_MEMTABLES <<< "$(python3 - $((KPORT+100)) "$d/cluster-secret" <<'EOF'
import sys, urllib.request
base = int(sys.argv[1])
# `keyway dev` guards its admin ports with the secret it made in its data dir.
auth = {"Authorization": "Bearer " + open(sys.argv[2]).read().strip()}
names = ["keyway_storage_cache_bytes", "keyway_storage_cache_capacity_bytes", "keyway_storage_write_buffer_bytes"]
total = dict.fromkeys(names, 0.0)
for i in range(3):
    req = urllib.request.Request(f"http://127.0.0.1:{base + i}/metrics", headers=auth)
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in total:
            total[name] += float(value)
print(" ".join(str(int(total[n])) for n in names))
EOF
)"
K_KEYS=0
for p in $KPORT $((KPORT+1)) $((KPORT+2)); do K_KEYS=$((K_KEYS + $(redis-cli -p "$p" dbsize))); done
stop_keyway

[ "$R_KEYS" = "$KEYS" ] || { echo "Redis holds $R_KEYS keys, expected $KEYS" >&2; exit 1; }
[ "$K_KEYS" = "$KEYS" ] || { echo "Keyway holds $K_KEYS keys, expected $KEYS" >&2; exit 1; }
LOGICAL_KIB=$(awk -v n="$KEYS" -v v="$VSIZE" 'BEGIN { printf "%d", n * (v + length(sprintf("key:%d", n / 2))) / 1024 }')
awk -v k="$KEYS" -v rs="$R_SECS" -v ks="$K_SECS" -v rr="$R_RSS" -v kr="$K_RSS" -v ru="$R_USED" \
    -v rd="$R_DU" -v kd="$K_DU" -v lg="$LOGICAL_KIB" -v rf="$RF" 'BEGIN {
  printf "%-32s %14s %12s %12s %12s\n", "system", "SET/s (load)", "RSS_MiB", "disk_MiB", "used_MiB"
  printf "%-32s %14.0f %12.1f %12.1f %12.1f\n", "redis 3 masters, no replicas", k / rs, rr / 1024, rd / 1024, ru / 1048576
  printf "%-32s %14.0f %12.1f %12.1f %12s\n", "keyway rf=" rf, k / ks, kr / 1024, kd / 1024, "-"
  printf "keyway/redis: load %.2f, RSS %.2f, disk %.2f; keyway disk / logical data (%.1f MiB): %.2f\n",
    (k / ks) / (k / rs), kr / rr, kd / rd, lg / 1024, kd / lg
}'
awk -v c="$K_CACHE" -v cap="$K_CACHE_CAP" -v m="$K_MEMTABLES" 'BEGIN {
  printf "keyway storage memory (3 nodes, /metrics at the RSS reading): block cache %.1f of %.1f MiB, memtables %.1f MiB\n",
    c / 1048576, cap / 1048576, m / 1048576
}'
