"""redis-py RedisCluster writing and reading back unique values continuously,
while the test runner (crates/keyway/tests/it/failover_redis_py.rs) kills nodes.

usage: failover_rw.py PORT[,PORT...] GROUPS OUT_JSON [--threads N (default: one per group)] [--keys-per-group K]
  GROUPS: slot ranges "a-b,c-d,..." (inclusive), one per partition: the
          slot groups failover times are measured for.

Protocol on stdin, one command a line:
  kill T   a node was killed at unix time T (seconds, float)
  stop     stop the workload, read every key back, write OUT_JSON, exit
Prints "ready" once the first write of every group was acknowledged.

Each worker thread owns its keys (so a read knows what it may see): it
picks a group and a key of that group, GETs it (so a write lost in a
failover is seen before the next write to the key hides it), SETs a
unique value and GETs it back. A key may read as its last acknowledged value, or as any value whose
SET had an unknown outcome (raised after it may have been sent); anything
else (an older acknowledged value, nothing) is a lost acknowledged write.
Errors are sorted into the ones a client must expect during a failover
(redirects, timeouts, connection errors, cluster-down: counted) and any
other (recorded as bad). For each kill and each group, the recovery time
is the time from the kill to the first acknowledged SET of that group
invoked after the kill.
"""
import json
import random
import sys
import threading
import time

import redis.exceptions as rex
from redis.backoff import ConstantBackoff
from redis.retry import Retry
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

# What a client sees while a primary fails over: redirects, timeouts and
# connection errors, "cluster down", "try again", too many redirects.
EXPECTED = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.ClusterDownError,
    rex.TryAgainError,
    rex.MovedError,
    rex.AskError,
    rex.ClusterError,
    rex.SlotNotCoveredError,
)
SOCKET_TIMEOUT_S = 1.0
CONNECT_TIMEOUT_S = 0.5
FINAL_READ_TIMEOUT_S = 60.0
BACKOFF_S = 0.02


def parse_groups(text):
    groups = []
    for part in text.split(","):
        a, b = part.split("-")
        groups.append((int(a), int(b)))
    return groups


def keys_for(groups, per_group, threads):
    """per_group keys per group, spread over the group's slots. Group g's
    keys go to threads g, g + len(groups), ... (mod threads): with as many
    threads as groups each thread owns one group, so a group's recovery is
    measured by a worker that tries nothing else (a worker busy with another
    group's slow writes would otherwise delay its first try)."""
    keys = [[[] for _ in groups] for _ in range(threads)]
    rng = random.Random(12)
    for g, (a, b) in enumerate(groups):
        want = per_group
        while want > 0:
            k = b"fo:%d:%x" % (g, rng.getrandbits(48))
            if a <= key_slot(k) <= b:
                keys[(g + want * len(groups)) % threads][g].append(k)
                want -= 1
    return keys


class Shared:
    def __init__(self, groups):
        self.lock = threading.Lock()
        self.groups = groups
        self.kills = []  # unix times
        self.acks = [[] for _ in groups]  # per group: (invoke_t, ack_t) of acked SETs
        self.expected_errors = {}
        self.bad_errors = []
        self.lost = []
        self.acked = 0
        self.reads = 0
        self.stop = False

    def error(self, e, what):
        with self.lock:
            if isinstance(e, EXPECTED):
                name = type(e).__name__
                self.expected_errors[name] = self.expected_errors.get(name, 0) + 1
            elif len(self.bad_errors) < 50:
                self.bad_errors.append("%s: %s: %s" % (what, type(e).__name__, e))


def client(ports):
    nodes = [ClusterNode("127.0.0.1", p) for p in ports]
    return RedisCluster(
        startup_nodes=nodes,
        decode_responses=False,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        # redis-py's default cluster retry sleeps with jittered exponential
        # back-off (1 s base, 10 s cap) between its attempts: a write sent
        # just after a kill would then measure the client's own sleeps, not
        # the failover. The same three attempts, BACKOFF_S apart.
        retry=Retry(ConstantBackoff(BACKOFF_S), retries=3),
    )


def worker(index, ports, my_keys, shared, state):
    rc = client(ports)
    rng = random.Random(index)
    seq = 0
    groups = [g for g in range(len(my_keys)) if my_keys[g]]
    while not shared.stop:
        g = rng.choice(groups)
        key = rng.choice(my_keys[g])
        seq += 1
        value = b"%d.%d" % (index, seq)
        st = state[key]
        # Read before write: after a failover, a key's last acknowledged
        # value must be there before it is overwritten (else a lost write
        # would be hidden by the next one).
        try:
            before = rc.get(key)
        except Exception as e:  # noqa: BLE001
            shared.error(e, "GET")
            time.sleep(BACKOFF_S)
            continue
        with shared.lock:
            shared.reads += 1
        check(key, before, st, shared, "read before write")
        invoked = time.time()
        try:
            ok = rc.set(key, value)
        except Exception as e:  # noqa: BLE001 - sorted in error()
            st["maybe"].add(value)
            shared.error(e, "SET")
            time.sleep(BACKOFF_S)
            continue
        acked = time.time()
        if ok is not True:
            with shared.lock:
                shared.bad_errors.append("SET %r answered %r" % (key, ok))
            continue
        st["acked"] = value
        with shared.lock:
            shared.acked += 1
            shared.acks[g].append((invoked, acked))
        try:
            got = rc.get(key)
        except Exception as e:  # noqa: BLE001
            shared.error(e, "GET")
            time.sleep(BACKOFF_S)
            continue
        with shared.lock:
            shared.reads += 1
        check(key, got, st, shared, "read-back")
    rc.close()


def check(key, got, st, shared, when):
    if got == st["acked"] or got in st["maybe"]:
        return True
    with shared.lock:
        if len(shared.lost) < 50:
            shared.lost.append(
                "%s of %r: got %r, last acknowledged %r" % (when, key, got, st["acked"])
            )
    return False


def final_reads(ports, keys, state, shared):
    rc = client(ports)
    deadline = time.time() + FINAL_READ_TIMEOUT_S
    verified = 0
    unreadable = 0
    for per_thread in keys:
        for per_group in per_thread:
            for key in per_group:
                while True:
                    try:
                        got = rc.get(key)
                        break
                    except Exception as e:  # noqa: BLE001
                        if not isinstance(e, EXPECTED):
                            shared.error(e, "final GET")
                        if time.time() > deadline:
                            got = None
                            unreadable += 1
                            break
                        time.sleep(0.1)
                st = state[key]
                if check(key, got, st, shared, "final read"):
                    verified += 1
    rc.close()
    return verified, unreadable


def recovery(shared):
    """Per kill, per group: seconds from the kill to the first acked SET invoked after it."""
    out = []
    for t in shared.kills:
        per_group = []
        for acks in shared.acks:
            after = [a for (i, a) in acks if i >= t]
            per_group.append(min(after) - t if after else None)
        out.append({"t": t, "recovery_s": per_group})
    return out


def main():
    ports = [int(p) for p in sys.argv[1].split(",")]
    groups = parse_groups(sys.argv[2])
    out_path = sys.argv[3]
    threads = len(groups)
    per_group = 16
    args = sys.argv[4:]
    while args:
        if args[0] == "--threads":
            threads = int(args[1])
        elif args[0] == "--keys-per-group":
            per_group = int(args[1])
        else:
            raise SystemExit("unknown argument " + args[0])
        args = args[2:]
    keys = keys_for(groups, per_group, threads)
    state = {
        k: {"acked": None, "maybe": set()}
        for per_thread in keys
        for per_group_keys in per_thread
        for k in per_group_keys
    }
    shared = Shared(groups)
    workers = [
        threading.Thread(target=worker, args=(i, ports, keys[i], shared, state), daemon=True)
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    while True:
        with shared.lock:
            if all(shared.acks):
                break
        time.sleep(0.05)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "kill":
            with shared.lock:
                shared.kills.append(float(words[1]))
        elif words[0] == "stop":
            break
    shared.stop = True
    for w in workers:
        w.join(timeout=30)
    verified, unreadable = final_reads(ports, keys, state, shared)
    report = {
        "acked": shared.acked,
        "reads": shared.reads,
        "keys": len(state),
        "verified": verified,
        "unreadable": unreadable,
        "expected_errors": shared.expected_errors,
        "bad_errors": shared.bad_errors,
        "lost": shared.lost,
        "kills": recovery(shared),
    }
    with open(out_path, "w") as f:
        json.dump(report, f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
