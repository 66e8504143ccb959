#!/usr/bin/env bash
# Adding a fourth node under load: Keyway against Redis Cluster, in one run.
#
# Loads the same data (--keys keys of --value-size random bytes, named mc:<i>,
# through a redis-py RedisCluster pipeline) into a 3-node Redis Cluster
# (Debian redis-server, appendonly yes) and a 3-node `keyway dev` (4
# partitions per node), then gives each a fourth node and moves a quarter of
# the data to it:
#   Redis:  redis-cli --cluster add-node, then
#           redis-cli --cluster rebalance --cluster-use-empty-masters
#           (4096 of the 16384 slots move to the new master);
#   Keyway: `keyway server` joined to the dev cluster, then
#           `keyway ctl move` of 3 of the 12 partitions (the lowest partition
#           of each node, 4095-4096 slots in all) to it.
# A foreground `redis-benchmark --cluster -t set,get` load (fixed -c) runs
# back-to-back chunks before the move (the reference) and during it. The
# latency distributions of the chunks in a window are merged (conservatively,
# from redis-benchmark's percentile lines); a window's ops/s is the clients
# over the mean latency (Little's law: closed loop, one request per client),
# because redis-benchmark --cluster rounds each chunk's time up to its 250 ms
# tick (a 10,000-request chunk never showed more than 40,000/s). After the move every loaded key is
# read back and compared. Prints both systems side by side with ratios.
#
# redis-benchmark --cluster writes each node's keys into one slot, so it is
# only the load generator here; the data is loaded by redis-py.
#
# usage: bench/migrate-compare.sh [--keys N] [--value-size B] [-c CLIENTS]
#          [--chunk REQUESTS] [--before-secs S] [--fsync always|everysec]
#          [--cleanup-grace-ms MS] [--keep]
#   --fsync picks Redis's appendfsync (default always); Keyway's durability is
#   matched to it (always -> group, everysec -> periodic).
#   --cleanup-grace-ms is Keyway's migration cleanup grace (default 1000 ms,
#   the product default is 30000): the move's "done" time includes it.
#   --keep leaves the work directory (logs, benchmark output) in place.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=200000; VSIZE=256; C=20; CHUNK=10000; BEFORE_SECS=10; FSYNC=always; GRACE_MS=1000; KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) KEYS=$2; shift 2;; --value-size) VSIZE=$2; shift 2;;
    -c) C=$2; shift 2;; --chunk) CHUNK=$2; shift 2;;
    --before-secs) BEFORE_SECS=$2; shift 2;;
    --fsync) FSYNC=$2; shift 2;; --cleanup-grace-ms) GRACE_MS=$2; shift 2;;
    --keep) KEEP=1; shift;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
case "$FSYNC" in always) KW_DUR=group;; everysec) KW_DUR=periodic;; *) echo "bad --fsync (always|everysec)" >&2; exit 2;; esac
bash scripts/setup.sh >/dev/null
cargo build --release --bin keyway -q
KW=./target/release/keyway
WORK=$(mktemp -d)
BG_PIDS=()
cleanup() {
  trap - EXIT INT TERM
  touch "$WORK/stop" 2>/dev/null || true
  for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${BG_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "${RPORT:-}" ]; then
    for i in 0 1 2 3; do redis-cli -p $((RPORT+i)) shutdown nosave >/dev/null 2>&1 || true; done
  fi
  for p in ${KW_NEW_PID:-} ${KW_PID:-}; do
    kill -INT "$p" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ "$KEEP" = 1 ]; then echo "work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
now() { date +%s.%N; }
log() { echo "[$(date +%T)] $*" >&2; }

# One block of free ports: Redis 4 (+ their cluster bus ports at +10000),
# Keyway meta 1, RESP 4, admin 4; all below the kernel's ephemeral range, so
# that no client connection can take one between this check and its use.
BASE=$(python3 - <<'EOF'
import random, socket, sys
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    low = 32768
for _ in range(2000):
    b = random.randint(10000, max(10001, low - 10000 - 20))
    ports = list(range(b, b + 13)) + [p + 10000 for p in range(b, b + 4)]
    if all(free(p) for p in ports):
        print(b)
        sys.exit(0)
sys.exit("no free block of ports")
EOF
)
RPORT=$BASE; KMETA=$((BASE+4)); KPORT=$((BASE+5)); KADMIN=$((BASE+9))
KNEW=$((KPORT+3)); KNEW_ADMIN=$((KADMIN+3)); META=keyway://127.0.0.1:$KMETA

# ---- Redis Cluster: 3 masters, a 4th server started but not yet joined.
for i in 0 1 2 3; do
  d="$WORK/redis-$i"; mkdir -p "$d"
  redis-server --port $((RPORT+i)) --cluster-enabled yes --cluster-config-file "$d/nodes.conf" \
    --dir "$d" --appendonly yes --appendfsync "$FSYNC" --save '' --daemonize yes --logfile "$d/log" >/dev/null
done
for i in 0 1 2 3; do until redis-cli -p $((RPORT+i)) ping >/dev/null 2>&1; do sleep 0.05; done; done
redis-cli --cluster create 127.0.0.1:$RPORT 127.0.0.1:$((RPORT+1)) 127.0.0.1:$((RPORT+2)) --cluster-yes >/dev/null
until redis-cli -p $RPORT cluster info | grep -q 'cluster_state:ok'; do sleep 0.05; done

# ---- Keyway: `keyway dev` with 3 nodes x 4 partitions, one copy each
# (Redis's side has no replicas; with replicas `ctl move` of a primary is a
# replica add and switchover, not the live migration compared here). The
# rebalancer, splitter and merger are off: only the compared moves happen
# (the rebalancer would also move partitions to the empty new node).
$KW dev --nodes 3 --partitions-per-node 4 --replication-factor 1 \
  --no-rebalance --no-auto-split --no-auto-merge \
  --port $KPORT --admin-port $KADMIN --meta-port $KMETA \
  --manager-admin-port 0 --data "$WORK/keyway" --durability "$KW_DUR" \
  --migration-cleanup-grace-ms "$GRACE_MS" > "$WORK/keyway.out" 2>&1 &
KW_PID=$!
until grep -q 'Ctrl-C stops' "$WORK/keyway.out" 2>/dev/null; do
  kill -0 $KW_PID 2>/dev/null || { cat "$WORK/keyway.out"; exit 1; }; sleep 0.05
done
# The dev cluster's secret (made in its data directory): the joining
# `keyway server` and every `ctl` below send it.
export KEYWAY_CLUSTER_SECRET_FILE="$WORK/keyway/cluster-secret"

# ---- Data: the same keys and values into both, and the check afterwards.
data() { # load|verify port [new-node-port] -> (verify) "missing wrong keys-on-new-node"
  python3 - "$1" "$2" "$KEYS" "$VSIZE" "${3:-0}" <<'EOF'
import random, sys
from redis.cluster import RedisCluster
mode, port, n, vsize, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rc = RedisCluster(host="127.0.0.1", port=port, decode_responses=False)
def value(i):
    return random.Random(i).randbytes(vsize)
missing = wrong = on_new = 0
for start in range(0, n, 2000):
    ids = range(start, min(n, start + 2000))
    p = rc.pipeline(transaction=False)
    for i in ids:
        if mode == "load":
            p.set(b"mc:%d" % i, value(i))
        else:
            p.get(b"mc:%d" % i)
    replies = p.execute()
    if mode == "load":
        bad = [r for r in replies if r is not True]
        if bad:
            sys.exit(f"load: unexpected replies {bad[:3]}")
    else:
        for i in ids:
            slot = rc.keyslot(b"mc:%d" % i)
            on_new += rc.nodes_manager.get_node_from_slot(slot).port == new
        for i, r in zip(ids, replies):
            if r is None:
                missing += 1
            elif r != value(i):
                wrong += 1
if mode == "verify":
    print(missing, wrong, on_new)
EOF
}
log "loading $KEYS keys x $VSIZE B into Redis (port $RPORT) and Keyway (port $KPORT)"
t=$(now); data load $RPORT; R_LOAD=$(python3 -c "print(f'{$(now)-$t:.1f}')")
t=$(now); data load $KPORT; K_LOAD=$(python3 -c "print(f'{$(now)-$t:.1f}')")
log "loaded: Redis in ${R_LOAD}s, Keyway in ${K_LOAD}s"

# ---- Foreground load: back-to-back redis-benchmark chunks until $stop exists.
fg_loop() { # port outdir stopfile
  local n=0
  mkdir -p "$2"
  while [ ! -e "$3" ]; do
    n=$((n+1))
    redis-benchmark --cluster -p "$1" -t set,get -n "$CHUNK" -c "$C" -d "$VSIZE" -r 10000 \
      > "$2/chunk-$n.raw" 2>&1 || echo "redis-benchmark exited $?" >> "$2/chunk-$n.raw"
  done
}
fg_start() { # port outdir stopfile
  rm -f "$3"; fg_loop "$@" & FG_PID=$!; BG_PIDS+=("$FG_PID")
}
fg_stop() { # stopfile
  touch "$1"; wait "$FG_PID" 2>/dev/null || true
}

# Redis: reference window, join, then the rebalance under load.
log "Redis: foreground reference for ${BEFORE_SECS}s"
fg_start $RPORT "$WORK/fg/redis-before" "$WORK/stop-r1"; sleep "$BEFORE_SECS"; fg_stop "$WORK/stop-r1"
redis-cli --cluster add-node 127.0.0.1:$((RPORT+3)) 127.0.0.1:$RPORT > "$WORK/redis-add.out" 2>&1
until [ "$(redis-cli -p $RPORT cluster nodes | grep -c master)" = 4 ] \
  && redis-cli -p $((RPORT+3)) cluster info | grep -q 'cluster_state:ok'; do sleep 0.1; done
sleep 1 # let the new master's config propagate through the bus
log "Redis: rebalance under load"
fg_start $RPORT "$WORK/fg/redis-during" "$WORK/stop-r2"; sleep 1
t=$(now)
redis-cli --cluster rebalance 127.0.0.1:$RPORT --cluster-use-empty-masters > "$WORK/redis-rebalance.out" 2>&1 \
  || { cat "$WORK/redis-rebalance.out"; exit 1; }
R_MOVE=$(python3 -c "print(f'{$(now)-$t:.2f}')")
fg_stop "$WORK/stop-r2"
R_NEW_SLOTS=$(redis-cli -p $((RPORT+3)) cluster nodes | grep myself \
  | awk '{ n=0; for (i=9;i<=NF;i++) if ($i !~ /^\[/) { k=split($i,a,"-"); n += (k==1 ? 1 : a[2]-a[1]+1) } print n }')
log "Redis: rebalance took ${R_MOVE}s; the new master holds $R_NEW_SLOTS slots"

# Keyway: reference window, join, then the moves under load.
log "Keyway: foreground reference for ${BEFORE_SECS}s"
fg_start $KPORT "$WORK/fg/keyway-before" "$WORK/stop-k1"; sleep "$BEFORE_SECS"; fg_stop "$WORK/stop-k1"
$KW --log warn server --meta "$META" --listen 127.0.0.1:$KNEW --admin-listen 127.0.0.1:$KNEW_ADMIN \
  --data "$WORK/keyway-n4" --durability "$KW_DUR" > "$WORK/keyway-n4.out" 2>&1 &
KW_NEW_PID=$!
until $KW --log error ctl --meta "$META" --json nodes 2>/dev/null \
  | python3 -c "import json,sys; sys.exit(0 if any(n['resp_addr']=='127.0.0.1:$KNEW' and n['state']=='up' for n in json.load(sys.stdin)) else 1)"; do
  kill -0 $KW_NEW_PID 2>/dev/null || { cat "$WORK/keyway-n4.out"; exit 1; }; sleep 0.1
done
# The lowest partition of each of the 3 nodes.
map_json() { $KW --log error ctl --meta "$META" --json map; }
MOVE_PIDS=$(map_json | python3 -c "
import json, sys
m = json.load(sys.stdin)
first = {}
for p in m['partitions'].values():
    o = p['owner']
    if o not in first or p['start'] < first[o]['start']:
        first[o] = p
print(' '.join(str(p['id']) for p in sorted(first.values(), key=lambda p: p['start'])))")
log "Keyway: moving partitions $MOVE_PIDS to 127.0.0.1:$KNEW under load"
fg_start $KPORT "$WORK/fg/keyway-during" "$WORK/stop-k2"; sleep 1
t=$(now)
for p in $MOVE_PIDS; do
  $KW --log error ctl --meta "$META" move "$p" --to 127.0.0.1:$KNEW --detach 2>>"$WORK/keyway-move.out"
done
owned() { # how many of MOVE_PIDS the new node owns
  map_json | python3 -c "
import json, sys
m = json.load(sys.stdin)
new = [n['id'] for n in m['nodes'].values() if n['resp_addr'] == '127.0.0.1:$KNEW'][0]
print(sum(1 for p in '$MOVE_PIDS'.split() if m['partitions'][p]['owner'] == new))"
}
migrations() { $KW --log error ctl --meta "$META" --json migrations; }
ended() { # how many migrations of MOVE_PIDS ended (DONE or ABORTED)
  migrations | python3 -c "
import json, sys
moved = set('$MOVE_PIDS'.split())
print(sum(1 for r in json.load(sys.stdin) if str(r['partition']) in moved and r['state'] in ('DONE', 'ABORTED')))"
}
NMOVES=$(echo $MOVE_PIDS | wc -w)
K_FLIP=""
deadline=$(( $(date +%s) + 600 ))
while :; do
  if [ -z "$K_FLIP" ] && [ "$(owned)" = "$NMOVES" ]; then K_FLIP=$(python3 -c "print(f'{$(now)-$t:.2f}')"); fi
  [ "$(ended)" = "$NMOVES" ] && break
  [ "$(date +%s)" -lt $deadline ] || {
    log "Keyway: moves did not end in 600 s"; migrations; cat "$WORK/keyway-move.out" >&2; exit 1; }
  sleep 0.1
done
K_DONE=$(python3 -c "print(f'{$(now)-$t:.2f}')")
fg_stop "$WORK/stop-k2"
migrations > "$WORK/keyway-migrations.json"
K_STATES=$(python3 -c "
import json; rs = json.load(open('$WORK/keyway-migrations.json'))
def steps(r):
    s = r.get('cutover_steps') or {}
    return '/'.join(f\"{s.get(k, 0) / 1000:.1f}\" for k in ('fence_us', 'digest_us', 'flip_us', 'serve_us'))
print(' '.join(f\"{r['partition']}:{r['state']}:pause={r['pause_ms']}ms:steps={steps(r)}ms:{r['total_bytes']}B\" for r in rs))")
log "Keyway: new node owns all moved partitions after ${K_FLIP:-never}s, moves ended after ${K_DONE}s: $K_STATES"

# ---- Keys lost.
read -r R_MISSING R_WRONG R_ON_NEW <<<"$(data verify $RPORT $((RPORT+3)))"
read -r K_MISSING K_WRONG K_ON_NEW <<<"$(data verify $KPORT $KNEW)"

# ---- Merge the foreground chunks and print.
python3 - "$WORK/fg" <<EOF
import glob, os, re, sys
fg = sys.argv[1]
line_re = re.compile(r"^\s*([\d.]+)% <= ([\d.]+) milliseconds \(cumulative count (\d+)\)")
def window(name):
    """Per test: merged (requests, seconds, p50, p99, max, errors, reconfigs) over the chunks."""
    tests = {}
    errors = reconfigs = aborted = last_reqs = 0
    for path in sorted(glob.glob(os.path.join(fg, name, "chunk-*.raw"))):
        text = open(path, errors="replace").read().replace("\r", "\n")
        test = None
        in_pct = in_avg = False
        for line in text.split("\n"):
            m = re.match(r"^\s*====== (\S+) ======", line)
            if m:
                test = m.group(1); in_pct = False
                tests.setdefault(test, {"chunks": [], "lat_ms": 0.0, "reqs": 0})
                tests[test]["chunks"].append([])
                continue
            if "Latency by percentile distribution" in line:
                in_pct = True; continue
            if "Cumulative distribution of latencies" in line or line.startswith("Summary"):
                in_pct = False; continue
            m = re.match(r"^\s*(\d+) requests completed in", line)
            if m and test:
                tests[test]["reqs"] += int(m.group(1)); last_reqs = int(m.group(1))
            # The chunk's mean latency (the line after the summary's
            # header): its requests times it, for the window's mean.
            if "latency summary (msec)" in line:
                in_avg = True; continue
            if in_avg and test and "avg" not in line:
                nums = re.findall(r"[\d.]+", line)
                if nums:
                    tests[test]["lat_ms"] += last_reqs * float(nums[0]); in_avg = False
                continue
            m = line_re.match(line)
            if m and in_pct and test:
                tests[test]["chunks"][-1].append((float(m.group(2)), int(m.group(3))))
            low = line.lower()
            if "error" in low:
                errors += 1
            if "redis-benchmark exited" in low:
                aborted += 1
            if "configuration changed" in low:
                reconfigs += 1
    out = {}
    for t, d in tests.items():
        chunks = [c for c in d["chunks"] if c]
        total = sum(c[-1][1] for c in chunks)
        if not total:
            continue
        lats = sorted({l for c in chunks for l, _ in c})
        def cdf(x):  # requests known to be <= x (each chunk's step function)
            return sum(max([n for l, n in c if l <= x], default=0) for c in chunks)
        def q(p):
            return next((x for x in lats if cdf(x) >= p * total), lats[-1])
        # Closed loop, one request per client at a time: ops/s = clients /
        # mean latency (Little's law). redis-benchmark's own rate is not
        # usable here: in cluster mode it notices a run's end on its 250 ms
        # tick, and a chunk lasts well under a second.
        mean_ms = d["lat_ms"] / d["reqs"] if d["reqs"] else 0
        out[t] = dict(reqs=d["reqs"], ops=$C * 1000 / mean_ms if mean_ms else 0,
                      p50=q(0.5), p99=q(0.99), max=lats[-1])
    return out, errors, reconfigs, aborted

rb, rbe, _, rba = window("redis-before"); rd, rde, rdr, rda = window("redis-during")
kb, kbe, _, kba = window("keyway-before"); kd, kde, kdr, kda = window("keyway-during")
def f(v, fmt="{:.2f}"):
    return "-" if v is None or v == "" else fmt.format(float(v))
def ratio(k, r):
    try:
        k, r = float(k), float(r)
        return f"{k / r:.2f}" if r > 0 else "-"
    except (TypeError, ValueError):
        return "-"
rows = [("time to move the quarter (s): new node owns it", "$R_MOVE", "$K_FLIP"),
        ("  ... until the sources dropped their copies (s)", "$R_MOVE", "$K_DONE")]
for t in ("SET", "GET"):
    rows.append((f"{t} p99 ms before the move", rb.get(t, {}).get("p99"), kb.get(t, {}).get("p99")))
    rows.append((f"{t} p99 ms during the move", rd.get(t, {}).get("p99"), kd.get(t, {}).get("p99")))
    rows.append((f"{t} max ms during the move", rd.get(t, {}).get("max"), kd.get(t, {}).get("max")))
    rows.append((f"{t} ops/s before the move", rb.get(t, {}).get("ops"), kb.get(t, {}).get("ops")))
    rows.append((f"{t} ops/s during the move", rd.get(t, {}).get("ops"), kd.get(t, {}).get("ops")))
rows.append(("benchmark error replies before/during", f"{rbe}/{rde}", f"{kbe}/{kde}"))
rows.append(("benchmark chunks aborted before/during (*)", f"{rba}/{rda}", f"{kba}/{kda}"))
rows.append(("benchmark slot-map refreshes during", f"{rdr}", f"{kdr}"))
rows.append(("loaded keys now on the new node", "$R_ON_NEW", "$K_ON_NEW"))
rows.append(("keys lost (missing + wrong) of $KEYS", "$((R_MISSING+R_WRONG))", "$((K_MISSING+K_WRONG))"))
print()
print("Adding a 4th node and moving a quarter of $KEYS keys x $VSIZE B under a foreground load")
print("  foreground: redis-benchmark --cluster -t set,get -c $C -d $VSIZE -r 10000, chunks of -n $CHUNK; ops/s = clients / mean latency")
print("  Redis $(redis-server --version | awk '{print $3}' | tr -d v=): appendonly yes, appendfsync $FSYNC; "
      "add-node + rebalance --cluster-use-empty-masters")
print("  Keyway: durability $KW_DUR, cleanup grace $GRACE_MS ms; keyway server joined + ctl move of partitions $MOVE_PIDS")
print("  machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)")
print(f"{'':50} {'redis':>10} {'keyway':>10} {'keyway/redis':>13}")
for label, r, k in rows:
    if isinstance(r, str) and ("/" in r or label.startswith(("benchmark", "loaded", "keys lost"))):
        print(f"{label:50} {r:>10} {k:>10} {'':>13}")
    else:
        print(f"{label:50} {f(r):>10} {f(k):>10} {ratio(k, r):>13}")
print()
print("(*) redis-benchmark --cluster exits when a master it skipped at start (the new, empty one)")
print("    gets slots ('could not find node with ID ...'); that chunk's figures are lost, the next chunk")
print("    starts with the new configuration. A limitation of the load generator, seen on both systems.")
print("Redis: the new master holds $R_NEW_SLOTS slots")
print("Keyway migrations (partition:state:cutover pause:steps fence/digest/flip/serve:bytes): $K_STATES")
EOF
