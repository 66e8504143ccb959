"""Bulk load and verify of N keys through redis-py's RedisCluster, for the
recovery test (crates/keyway/tests/it/recovery_redis_py.rs).

usage: bulk.py load|verify PORT[,PORT...] N VALUE_BYTES [--batch B]

Key i is b"bk:%d" % i and its value is the decimal i, a colon, then
filler up to VALUE_BYTES bytes (so a value read back names its key).
`load` SETs every key in pipelines of B (redis-py's cluster pipeline sends
each command to its slot's primary), retrying a batch that failed (a SET is
idempotent here), and prints "loaded N SECONDS". `verify` GETs every key in
pipelines of B and prints one JSON line: {"keys", "ok", "wrong", "missing",
"seconds", "examples"}; it exits 0 even when keys are wrong (the test judges).

redis-py's cluster pipeline is used on purpose: `redis-benchmark --cluster`
(7.0) writes all of a node's keys into one slot.
"""
import json
import sys
import time

import redis.exceptions as rex
from redis.backoff import ConstantBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

RETRIES = 50
RETRY_PAUSE_S = 0.2


def value(i, size):
    head = b"%d:" % i
    return head + b"v" * max(0, size - len(head))


def client(ports):
    return RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", p) for p in ports],
        decode_responses=False,
        socket_timeout=5.0,
        socket_connect_timeout=1.0,
        retry=Retry(ConstantBackoff(0.05), retries=3),
    )


def batches(n, b):
    for start in range(0, n, b):
        yield range(start, min(n, start + b))


def run_batch(rc, build):
    """Runs a pipeline built by `build(pipe)`, retrying on the errors a
    client sees while slots move or fail over; returns the results."""
    for attempt in range(RETRIES):
        pipe = rc.pipeline(transaction=False)
        build(pipe)
        try:
            return pipe.execute(raise_on_error=True)
        except (rex.ConnectionError, rex.TimeoutError, rex.ClusterError,
                rex.MovedError, rex.AskError, rex.TryAgainError, rex.ResponseError) as e:
            if attempt + 1 == RETRIES:
                raise
            print("retrying a batch after %s: %s" % (type(e).__name__, e), file=sys.stderr)
            time.sleep(RETRY_PAUSE_S)
            rc.nodes_manager.initialize()
    raise AssertionError("unreachable")


def load(rc, n, size, b):
    t0 = time.time()
    for idx in batches(n, b):
        def build(pipe, idx=idx):
            for i in idx:
                pipe.set(b"bk:%d" % i, value(i, size))
        res = run_batch(rc, build)
        bad = [r for r in res if r is not True]
        if bad:
            raise SystemExit("SET answered %r" % bad[:3])
    print("loaded %d %.3f" % (n, time.time() - t0), flush=True)


def verify(rc, n, size, b):
    t0 = time.time()
    ok = wrong = missing = 0
    examples = []
    for idx in batches(n, b):
        def build(pipe, idx=idx):
            for i in idx:
                pipe.get(b"bk:%d" % i)
        res = run_batch(rc, build)
        for i, got in zip(idx, res):
            if got == value(i, size):
                ok += 1
            elif got is None:
                missing += 1
                if len(examples) < 10:
                    examples.append("bk:%d missing" % i)
            else:
                wrong += 1
                if len(examples) < 10:
                    examples.append("bk:%d = %r" % (i, got[:40]))
    print(json.dumps({
        "keys": n, "ok": ok, "wrong": wrong, "missing": missing,
        "seconds": round(time.time() - t0, 3), "examples": examples,
    }), flush=True)


def main():
    mode = sys.argv[1]
    ports = [int(p) for p in sys.argv[2].split(",")]
    n = int(sys.argv[3])
    size = int(sys.argv[4])
    b = 1000
    args = sys.argv[5:]
    while args:
        if args[0] == "--batch":
            b = int(args[1])
        else:
            raise SystemExit("unknown argument " + args[0])
        args = args[2:]
    rc = client(ports)
    if mode == "load":
        load(rc, n, size, b)
    elif mode == "verify":
        verify(rc, n, size, b)
    else:
        raise SystemExit("unknown mode " + mode)
    rc.close()


if __name__ == "__main__":
    main()
