"""A redis-py RedisCluster workload that checks what it reads while partitions move.

usage: migrate_workload.py PORT STOPFILE REPORT_JSON [THREADS] [--plain]

With --plain the clients are plain `redis.Redis` clients (no cluster
support) talking to one `keyway proxy`: they must never see a redirect
(a MOVED/ASK reaching the application is an error), and every few
iterations a thread also MSETs three of its own keys from different slots
(not atomic through the proxy: each key is checked on its own) and MGETs
them back.

Every thread has its own RedisCluster client and its own keys (`w{thread}:{i}`,
spread over all slots, plus a few hash-tagged pairs `{w{thread}t{j}}a|b`), so
it alone writes them and knows exactly which value each one must hold. A
thread loops:

  * SET a random key of its own to the next value of that key's counter
    (values strictly increase per key); the value counts as acknowledged only
    once SET returned True;
  * GET a random key of its own: a value older than the last acknowledged
    one (or none at all after an acknowledgement) is a stale read, a value
    newer than the last attempted one is a phantom read;
  * every few iterations, MSET a hash-tagged pair to one new value, then
    MGET it back: both values must be equal (MSET is atomic) and obey the
    same rules.

The clients follow MOVED/ASK themselves (counted, not errors). They get no
connection retries: any exception that reaches the application, including a
connection error or timeout, is an error.

Prints `started` once every thread has acknowledged some writes, then a
`progress ...` line every half second. Once STOPFILE exists the threads stop,
a fresh client reads every key back (each must hold its last acknowledged
value, else it is lost), REPORT_JSON is written, and a summary line printed.
"""
import json
import os
import random
import sys
import threading
import time
import traceback

import redis
import redis.client
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, TryAgainError
from redis.retry import Retry

KEYS_PER_THREAD = 200
TAGS_PER_THREAD = 16
MULTI_EVERY = 8
STARTED_AFTER = 20  # acknowledged writes per thread before `started`
MAX_SAMPLES = 20
SOCKET_TIMEOUT = 20.0

lock = threading.Lock()
redirects = {"moved": 0, "ask": 0, "tryagain": 0}
# --plain: redis.Redis through a proxy instead of RedisCluster.
plain = False


def count_redirects():
    """Counts the MOVED/ASK/TRYAGAIN replies RedisCluster handles internally."""
    original = redis.client.Redis.parse_response

    def parse_response(self, connection, command_name, **options):
        try:
            return original(self, connection, command_name, **options)
        except MovedError:
            with lock:
                redirects["moved"] += 1
            raise
        except AskError:
            with lock:
                redirects["ask"] += 1
            raise
        except TryAgainError:
            with lock:
                redirects["tryagain"] += 1
            raise

    redis.client.Redis.parse_response = parse_response


def client(port):
    if plain:
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
        )
    return RedisCluster(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
    )


class Worker:
    def __init__(self, index, port, stop):
        self.index = index
        self.port = port
        self.stop = stop
        self.keys = ["w%d:%d" % (index, i) for i in range(KEYS_PER_THREAD)]
        self.tags = ["{w%dt%d}" % (index, j) for j in range(TAGS_PER_THREAD)]
        # name -> last acknowledged / last attempted value (0 = never).
        self.acked = {k: 0 for k in self.keys + self.tags}
        self.attempted = dict(self.acked)
        self.writes = 0
        self.reads = 0
        self.multi = 0
        self.stale = []
        self.stale_count = 0
        self.phantom = []
        self.phantom_count = 0
        self.errors = []
        self.error_count = 0
        self.max_op_ms = 0.0
        self.rng = random.Random(index * 7919 + os.getpid())
        self.thread = threading.Thread(target=self.run, daemon=True)

    def error(self, what, exc):
        self.error_count += 1
        if len(self.errors) < MAX_SAMPLES:
            self.errors.append(
                {
                    "thread": self.index,
                    "op": what,
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "time": time.time(),
                }
            )

    def check(self, name, got, op):
        """Checks a value read for `name` against what this thread wrote."""
        acked, attempted = self.acked[name], self.attempted[name]
        value = None if got is None else int(got)
        sample = {
            "thread": self.index,
            "op": op,
            "key": name,
            "got": got,
            "acked": acked,
            "attempted": attempted,
            "time": time.time(),
        }
        if acked > 0 and (value is None or value < acked):
            self.stale_count += 1
            if len(self.stale) < MAX_SAMPLES:
                self.stale.append(sample)
        elif value is not None and value > attempted:
            self.phantom_count += 1
            if len(self.phantom) < MAX_SAMPLES:
                self.phantom.append(sample)

    def timed(self, fn, *args):
        start = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.max_op_ms = max(self.max_op_ms, (time.monotonic() - start) * 1000)

    def run(self):
        try:
            rc = client(self.port)
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            self.error("connect", e)
            return
        iteration = 0
        while not self.stop.is_set():
            iteration += 1
            key = self.rng.choice(self.keys)
            value = self.attempted[key] + 1
            self.attempted[key] = value
            try:
                reply = self.timed(rc.set, key, str(value))
                if reply is True:
                    self.acked[key] = value
                    self.writes += 1
                else:
                    self.error("set", RuntimeError("SET %s replied %r" % (key, reply)))
            except Exception as e:  # noqa: BLE001
                self.error("set %s" % key, e)

            key = self.rng.choice(self.keys)
            try:
                got = self.timed(rc.get, key)
                self.reads += 1
                self.check(key, got, "get")
            except Exception as e:  # noqa: BLE001
                self.error("get %s" % key, e)

            if iteration % MULTI_EVERY == 0:
                self.multi_key(rc)
                if plain:
                    self.cross_slot(rc)
        rc.close()

    def multi_key(self, rc):
        tag = self.rng.choice(self.tags)
        a, b = tag + "a", tag + "b"
        value = self.attempted[tag] + 1
        self.attempted[tag] = value
        try:
            reply = self.timed(rc.mset, {a: str(value), b: str(value)})
            if reply is True:
                self.acked[tag] = value
                self.writes += 1
                self.multi += 1
            else:
                self.error("mset", RuntimeError("MSET %s replied %r" % (tag, reply)))
        except Exception as e:  # noqa: BLE001
            self.error("mset %s" % tag, e)
        try:
            got = self.timed(rc.mget, [a, b])
            self.reads += 1
            self.multi += 1
            if got[0] != got[1]:
                self.stale_count += 1
                if len(self.stale) < MAX_SAMPLES:
                    self.stale.append(
                        {"thread": self.index, "op": "mget (torn)", "key": tag, "got": got}
                    )
            for v in got:
                self.check(tag, v, "mget")
        except Exception as e:  # noqa: BLE001
            self.error("mget %s" % tag, e)


    def cross_slot(self, rc):
        """MSET three of this thread's keys (different slots) to their next
        values, then MGET them back; each key is checked on its own."""
        keys = self.rng.sample(self.keys, 3)
        values = {}
        for key in keys:
            self.attempted[key] += 1
            values[key] = self.attempted[key]
        try:
            reply = self.timed(rc.mset, {k: str(v) for k, v in values.items()})
            if reply is True:
                for key, value in values.items():
                    self.acked[key] = value
                self.writes += 1
                self.multi += 1
            else:
                self.error("mset", RuntimeError("MSET %s replied %r" % (keys, reply)))
        except Exception as e:  # noqa: BLE001
            self.error("mset %s" % keys, e)
        try:
            got = self.timed(rc.mget, keys)
            self.reads += 1
            self.multi += 1
            for key, v in zip(keys, got):
                self.check(key, v, "mget")
        except Exception as e:  # noqa: BLE001
            self.error("mget %s" % keys, e)


def verify(port, workers):
    """Reads every key back with a fresh client; returns (checked, lost samples, lost count, errors)."""
    rc = client(port)
    checked, lost, lost_count, errors = 0, [], 0, []
    for w in workers:
        names = [(k, k) for k in w.keys]
        names += [(t + "a", t) for t in w.tags] + [(t + "b", t) for t in w.tags]
        for key, name in names:
            expected = w.acked[name]
            try:
                got = rc.get(key)
            except Exception as e:  # noqa: BLE001
                errors.append({"op": "verify %s" % key, "type": type(e).__name__, "message": str(e)})
                continue
            checked += 1
            want = None if expected == 0 else str(expected)
            if got != want:
                lost_count += 1
                if len(lost) < MAX_SAMPLES:
                    lost.append(
                        {
                            "key": key,
                            "got": got,
                            "acked": expected,
                            "attempted": w.attempted[name],
                        }
                    )
    rc.close()
    return checked, lost, lost_count, errors


def main():
    global plain
    argv = [a for a in sys.argv if a != "--plain"]
    plain = len(argv) != len(sys.argv)
    port, stopfile, report_path = int(argv[1]), argv[2], argv[3]
    threads = int(argv[4]) if len(argv) > 4 else 4
    count_redirects()
    stop = threading.Event()
    workers = [Worker(i, port, stop) for i in range(threads)]
    began = time.monotonic()
    for w in workers:
        w.thread.start()

    started = False
    last_progress = 0.0
    while not os.path.exists(stopfile):
        if all(not w.thread.is_alive() for w in workers):
            break
        if not started and all(w.writes >= STARTED_AFTER for w in workers):
            started = True
            print("started", flush=True)
        now = time.monotonic()
        if now - last_progress >= 0.5:
            last_progress = now
            print(
                "progress writes=%d reads=%d errors=%d stale=%d"
                % (
                    sum(w.writes for w in workers),
                    sum(w.reads for w in workers),
                    sum(w.error_count for w in workers),
                    sum(w.stale_count for w in workers),
                ),
                flush=True,
            )
        time.sleep(0.05)
    stop.set()
    for w in workers:
        w.thread.join(timeout=2 * SOCKET_TIMEOUT + 10)
    hung = [w.index for w in workers if w.thread.is_alive()]
    elapsed = time.monotonic() - began

    try:
        checked, lost, lost_count, verify_errors = verify(port, workers)
    except Exception as e:  # noqa: BLE001
        checked, lost, lost_count = 0, [], 0
        verify_errors = [{"op": "verify", "type": type(e).__name__, "message": traceback.format_exc()}]

    errors = [e for w in workers for e in w.errors] + verify_errors
    report = {
        "plain": plain,
        "threads": threads,
        "seconds": round(elapsed, 1),
        "writes": sum(w.writes for w in workers),
        "reads": sum(w.reads for w in workers),
        "multi_key_ops": sum(w.multi for w in workers),
        "keys_written": sum(1 for w in workers for v in w.acked.values() if v > 0),
        "stale_reads": sum(w.stale_count for w in workers),
        "stale_samples": [s for w in workers for s in w.stale][:MAX_SAMPLES],
        "phantom_reads": sum(w.phantom_count for w in workers),
        "phantom_samples": [s for w in workers for s in w.phantom][:MAX_SAMPLES],
        "errors": sum(w.error_count for w in workers) + len(verify_errors),
        "error_samples": errors[:MAX_SAMPLES],
        "hung_threads": hung,
        "verified": checked,
        "lost": lost_count,
        "lost_samples": lost,
        "redirects": dict(redirects),
        "max_op_ms": round(max(w.max_op_ms for w in workers), 1),
        "started": started,
    }
    with open(report_path + ".tmp", "w") as f:
        json.dump(report, f, indent=2)
    os.replace(report_path + ".tmp", report_path)
    print(
        "workload: %d writes, %d reads, %d multi-key ops in %.1fs; %d stale, %d phantom, "
        "%d errors, %d/%d lost; %d MOVED, %d ASK, %d TRYAGAIN; slowest op %.0f ms"
        % (
            report["writes"],
            report["reads"],
            report["multi_key_ops"],
            elapsed,
            report["stale_reads"],
            report["phantom_reads"],
            report["errors"],
            lost_count,
            checked,
            redirects["moved"],
            redirects["ask"],
            redirects["tryagain"],
            report["max_op_ms"],
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
