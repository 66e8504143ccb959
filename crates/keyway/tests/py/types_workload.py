"""A redis-py RedisCluster workload over every Redis type, checked while partitions move.

usage: types_workload.py PORT STOPFILE REPORT_JSON [THREADS] [--types string,hash,set,list,zset,multi]

Same protocol as migrate_workload.py: prints `started` once every thread has
acknowledged some writes of every enabled type, then a `progress ...` line
every half second; once STOPFILE exists the threads stop, a fresh client
reads every key back, REPORT_JSON is written and a summary line printed.

Every thread has its own RedisCluster client and its own keys of every
enabled type (`ty{run}.{thread}:{type}:{i}`, spread over all slots), so it alone
writes them and holds a model of each one's exact content:

  * string: SET to the next value of the thread's counter, read with GET;
  * hash: HSET (one or two fields), HINCRBY, HDEL; read with HGET, HGETALL;
  * set: SADD, SREM; read with SISMEMBER, SCARD, SMEMBERS;
  * list: RPUSH, LPOP, LTRIM; read with LRANGE, LLEN, LINDEX;
  * zset: ZADD, ZINCRBY, ZREM; read with ZSCORE, ZRANGE WITHSCORES, ZCARD;
  * multi: MULTI/EXEC (`pipeline(transaction=True)`) over five keys of one
    hash tag `{ty{run}.{thread}x{i}}` (a string, a hash, a set, a list and a zset,
    those of the enabled types), every transaction writing its number into
    all of them; read back in one MULTI/EXEC, every key must show the same
    last transaction (a torn read is an atomicity violation).

Every write's reply is checked against the model (HSET's count of new
fields, HINCRBY's and ZINCRBY's result, LPOP's element, ...), and every read
must equal the model exactly: any difference is a stale read (the node
answered from an older state than the one acknowledged), counted per type.
A write that raised leaves its key uncertain (either the old or the new
content); the next read of that key accepts either and adopts what it saw.

The clients follow MOVED/ASK themselves (counted, not errors); a transaction
rejected with MOVED/ASK (EXECABORT) was not applied, so it is sent again (at
most REDIRECTED_TX_RETRIES times) once redis-py updated its slot table. There
are no connection retries: any other exception that reaches the application
is an error.
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

ALL_TYPES = ["string", "hash", "set", "list", "zset", "multi"]
KEYS_PER_TYPE = 24
HASH_FIELDS = ["f%d" % i for i in range(6)]
SET_MEMBERS = ["m%d" % i for i in range(12)]
ZSET_MEMBERS = ["z%d" % i for i in range(8)]
LIST_MAX = 12  # LTRIM keeps the last LIST_MAX elements
TX_KEEP = 4  # a transaction group's set/list/zset keep the last TX_KEEP transactions
STARTED_AFTER = 5  # acknowledged writes per enabled type per thread before `started`
REDIRECTED_TX_RETRIES = 5
MAX_SAMPLES = 20
SOCKET_TIMEOUT = 20.0
# Key names carry a run id, so a second run against the same cluster starts from empty keys.
RUN = "%06x" % random.SystemRandom().getrandbits(24)

lock = threading.Lock()
redirects = {"moved": 0, "ask": 0, "tryagain": 0}


def count_redirects():
    """Counts the MOVED/ASK/TRYAGAIN replies redis-py handles internally."""
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
    return RedisCluster(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
    )


def zsorted(d):
    """A zset model (member -> score) in ZRANGE order."""
    return [(m, float(s)) for m, s in sorted(d.items(), key=lambda kv: (kv[1], kv[0]))]


class TxGroup:
    """The keys of one MULTI/EXEC group and the content `applied` implies."""

    def __init__(self, tag, types):
        self.tag = tag
        self.types = types

    def key(self, t):
        return self.tag + t

    def expected(self, applied):
        """applied: the numbers of the transactions applied so far, in order."""
        last = applied[-1] if applied else None
        keep = applied[-TX_KEEP:]
        out = {"string": None if last is None else str(last)}
        if "hash" in self.types:
            out["hash"] = {} if last is None else {"last": str(last), "n": str(len(applied))}
        if "set" in self.types:
            out["set"] = set(str(v) for v in keep)
        if "list" in self.types:
            out["list"] = [str(v) for v in keep]
        if "zset" in self.types:
            out["zset"] = zsorted({"t%d" % v: float(v) for v in keep})
        return out


class Worker:
    def __init__(self, index, port, stop, types):
        self.index = index
        self.port = port
        self.stop = stop
        self.types = types
        self.data_types = [t for t in types if t != "multi"]
        self.keys = {
            t: ["ty%s.%d:%s:%d" % (RUN, index, t, i) for i in range(KEYS_PER_TYPE)] for t in self.data_types
        }
        empty = {"string": None, "hash": {}, "set": set(), "list": [], "zset": {}}
        self.model = {k: _copy(empty[t]) for t in self.data_types for k in self.keys[t]}
        # key -> [content before, content after] of a write that raised.
        self.uncertain = {}
        self.groups = []
        if "multi" in types:
            self.groups = [
                TxGroup("{ty%s.%dx%d}" % (RUN, index, i), self.data_types) for i in range(KEYS_PER_TYPE // 2)
            ]
        # group tag -> transaction numbers applied; uncertain like the keys.
        self.applied = {g.tag: [] for g in self.groups}
        self.tx_uncertain = {}
        self.seq = 0
        self.writes = {t: 0 for t in types}
        self.reads = {t: 0 for t in types}
        self.stale = {t: 0 for t in types}
        self.stale_samples = []
        self.sample_cap = MAX_SAMPLES  # raised for the final pass's own samples
        self.phantom = 0
        self.phantom_samples = []
        self.errors = []
        self.error_count = 0
        self.tx_redirected = 0
        self.max_op_ms = 0.0
        self.rng = random.Random(index * 7919 + os.getpid())
        self.thread = threading.Thread(target=self.run, daemon=True)

    def next(self):
        self.seq += 1
        return self.seq

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

    def stale_read(self, t, op, key, got, want):
        self.stale[t] += 1
        if len(self.stale_samples) < self.sample_cap:
            self.stale_samples.append(
                {
                    "thread": self.index,
                    "type": t,
                    "op": op,
                    "key": key,
                    "got": _jsonable(got),
                    "want": _jsonable(want),
                    "time": time.time(),
                }
            )

    def timed(self, fn, *args, **kwargs):
        start = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self.max_op_ms = max(self.max_op_ms, (time.monotonic() - start) * 1000)

    # ---- writes: each returns (op name, call, expected reply, new content) ----

    def plan_write(self, rc, t, key, old):
        r = self.rng.random()
        if t == "string":
            v = str(self.next())
            return "set", lambda: rc.set(key, v), True, v
        if t == "hash":
            new = dict(old)
            if r < 0.5:
                fields = self.rng.sample(HASH_FIELDS, self.rng.choice([1, 2]))
                mapping = {f: str(self.next()) for f in fields}
                added = sum(1 for f in fields if f not in old)
                new.update(mapping)
                return "hset", lambda: rc.hset(key, mapping=mapping), added, new
            if r < 0.8:
                delta = self.rng.randint(1, 5)
                n = int(old.get("n", "0")) + delta
                new["n"] = str(n)
                return "hincrby", lambda: rc.hincrby(key, "n", delta), n, new
            f = self.rng.choice(HASH_FIELDS + ["n"])
            new.pop(f, None)
            return "hdel", lambda: rc.hdel(key, f), int(f in old), new
        if t == "set":
            m = self.rng.choice(SET_MEMBERS)
            if r < 0.6:
                return "sadd", lambda: rc.sadd(key, m), int(m not in old), old | {m}
            return "srem", lambda: rc.srem(key, m), int(m in old), old - {m}
        if t == "list":
            if r < 0.6 or not old:
                vs = [str(self.next()) for _ in range(self.rng.choice([1, 2]))]
                new = old + vs
                return "rpush", lambda: rc.rpush(key, *vs), len(new), new
            if r < 0.85:
                return "lpop", lambda: rc.lpop(key), old[0], old[1:]
            return "ltrim", lambda: rc.ltrim(key, -LIST_MAX // 2, -1), True, old[-(LIST_MAX // 2):]
        if t == "zset":
            m = self.rng.choice(ZSET_MEMBERS)
            new = dict(old)
            if r < 0.5:
                s = float(self.next())
                new[m] = s
                return "zadd", lambda: rc.zadd(key, {m: s}), int(m not in old), new
            if r < 0.8:
                s = old.get(m, 0.0) + 1.5
                new[m] = s
                return "zincrby", lambda: rc.zincrby(key, 1.5, m), s, new
            new.pop(m, None)
            return "zrem", lambda: rc.zrem(key, m), int(m in old), new
        raise ValueError(t)

    def write(self, rc, t):
        key = self.rng.choice(self.keys[t])
        if key in self.uncertain:
            self.read_whole(rc, t, key)
            if key in self.uncertain:
                return
        old = self.model[key]
        # Keep lists bounded: trim when long.
        if t == "list" and len(old) >= LIST_MAX:
            op, call, want, new = "ltrim", (lambda: rc.ltrim(key, -LIST_MAX // 2, -1)), True, old[-(LIST_MAX // 2):]
        else:
            op, call, want, new = self.plan_write(rc, t, key, old)
        try:
            reply = self.timed(call)
        except Exception as e:  # noqa: BLE001 - every exception is a finding
            self.error("%s %s" % (op, key), e)
            self.uncertain[key] = [old, new]
            return
        self.model[key] = new
        self.writes[t] += 1
        if _norm(reply) != _norm(want):
            # The reply shows the node applied the write to another state.
            self.stale_read(t, op + " (reply)", key, reply, want)

    # ---- reads ----

    def read_whole(self, rc, t, key):
        """Reads the whole key, checked against the model (or the candidates)."""
        if t == "string":
            op, got = "get", self.timed(rc.get, key)
        elif t == "hash":
            op, got = "hgetall", self.timed(rc.hgetall, key)
        elif t == "set":
            op, got = "smembers", self.timed(rc.smembers, key)
        elif t == "list":
            op, got = "lrange", self.timed(rc.lrange, key, 0, -1)
        else:
            op, got = "zrange", self.timed(rc.zrange, key, 0, -1, withscores=True)
        self.reads[t] += 1
        self.check_whole(t, op, key, got)

    def check_whole(self, t, op, key, got):
        shape = (lambda m: zsorted(m)) if t == "zset" else (lambda m: m)
        if key in self.uncertain:
            candidates = self.uncertain[key]
            for c in candidates:
                if _norm(got) == _norm(shape(c)):
                    self.model[key] = c
                    del self.uncertain[key]
                    return
            self.stale_read(t, op + " (uncertain)", key, got, [shape(c) for c in candidates])
            return
        want = shape(self.model[key])
        if _norm(got) != _norm(want):
            if t == "string" and got is not None and int(got) > self.seq:
                self.phantom += 1
                if len(self.phantom_samples) < MAX_SAMPLES:
                    self.phantom_samples.append({"key": key, "got": got, "want": want})
            else:
                self.stale_read(t, op, key, got, want)

    def read(self, rc, t):
        key = self.rng.choice(self.keys[t])
        if key in self.uncertain or self.rng.random() < 0.4:
            self.read_whole(rc, t, key)
            return
        m = self.model[key]
        r = self.rng.random()
        if t == "string":
            self.read_whole(rc, t, key)
            return
        if t == "hash":
            f = self.rng.choice(HASH_FIELDS + ["n"])
            op, got, want = "hget", self.timed(rc.hget, key, f), m.get(f)
        elif t == "set":
            if r < 0.6:
                mem = self.rng.choice(SET_MEMBERS)
                op, got, want = "sismember", int(self.timed(rc.sismember, key, mem)), int(mem in m)
            else:
                op, got, want = "scard", self.timed(rc.scard, key), len(m)
        elif t == "list":
            if r < 0.5:
                op, got, want = "llen", self.timed(rc.llen, key), len(m)
            else:
                i = self.rng.randint(-LIST_MAX, LIST_MAX - 1)
                want = m[i] if -len(m) <= i < len(m) else None
                op, got = "lindex", self.timed(rc.lindex, key, i)
        else:
            if r < 0.6:
                mem = self.rng.choice(ZSET_MEMBERS)
                op, got, want = "zscore", self.timed(rc.zscore, key, mem), m.get(mem)
            else:
                op, got, want = "zcard", self.timed(rc.zcard, key), len(m)
        self.reads[t] += 1
        if _norm(got) != _norm(want):
            self.stale_read(t, op, key, got, want)

    # ---- MULTI/EXEC ----

    def tx_write(self, rc):
        g = self.rng.choice(self.groups)
        if g.tag in self.tx_uncertain:
            self.tx_read(rc, g)
            if g.tag in self.tx_uncertain:
                return
        applied = self.applied[g.tag]
        v = self.next()
        new = applied + [v]
        for attempt in range(REDIRECTED_TX_RETRIES + 1):
            pipe = rc.pipeline(transaction=True)
            pipe.set(g.key("string"), str(v))
            if "hash" in g.types:
                pipe.hset(g.key("hash"), "last", str(v))
                pipe.hincrby(g.key("hash"), "n", 1)
            if "set" in g.types:
                pipe.sadd(g.key("set"), str(v))
                if len(applied) >= TX_KEEP:
                    pipe.srem(g.key("set"), str(new[-TX_KEEP - 1]))
            if "list" in g.types:
                pipe.rpush(g.key("list"), str(v))
                pipe.ltrim(g.key("list"), -TX_KEEP, -1)
            if "zset" in g.types:
                pipe.zadd(g.key("zset"), {"t%d" % v: float(v)})
                if len(applied) >= TX_KEEP:
                    pipe.zrem(g.key("zset"), "t%d" % new[-TX_KEEP - 1])
            try:
                replies = self.timed(pipe.execute)
            except (MovedError, AskError):
                # Rejected before EXEC ran anything (-MOVED queued commands,
                # EXECABORT); redis-py updated its slot table: send it again.
                self.tx_redirected += 1
                pipe.reset()
                continue
            except Exception as e:  # noqa: BLE001
                self.error("multi %s" % g.tag, e)
                self.tx_uncertain[g.tag] = [applied, new]
                pipe.reset()
                return
            self.applied[g.tag] = new
            self.writes["multi"] += 1
            # A cluster transaction applies no response callbacks: SET's "OK".
            if replies[0] not in (True, "OK"):
                self.stale_read("multi", "exec (reply)", g.tag, replies, "first reply True")
            return
        self.error("multi %s" % g.tag, RuntimeError("still redirected after %d tries" % REDIRECTED_TX_RETRIES))
        self.tx_uncertain[g.tag] = [applied, new]

    def tx_read_pipe(self, rc, g):
        pipe = rc.pipeline(transaction=True)
        pipe.get(g.key("string"))
        for t in g.types:
            if t == "hash":
                pipe.hgetall(g.key("hash"))
            elif t == "set":
                pipe.smembers(g.key("set"))
            elif t == "list":
                pipe.lrange(g.key("list"), 0, -1)
            elif t == "zset":
                pipe.zrange(g.key("zset"), 0, -1, withscores=True)
        return pipe

    def tx_read(self, rc, g):
        for attempt in range(REDIRECTED_TX_RETRIES + 1):
            pipe = self.tx_read_pipe(rc, g)
            try:
                replies = self.timed(pipe.execute)
                break
            except (MovedError, AskError):
                self.tx_redirected += 1
                pipe.reset()
                continue
            except Exception as e:  # noqa: BLE001
                self.error("multi read %s" % g.tag, e)
                pipe.reset()
                return
        else:
            self.error("multi read %s" % g.tag, RuntimeError("still redirected"))
            return
        self.reads["multi"] += 1
        got = {"string": replies[0]}
        for t, r in zip([t for t in g.types if t != "string"], replies[1:]):
            got[t] = _tx_reply(t, r)
        self.check_tx(g, got, "multi read")

    def check_tx(self, g, got, op):
        candidates = self.tx_uncertain.get(g.tag, [self.applied[g.tag]])
        for c in candidates:
            if _norm(got) == _norm(g.expected(c)):
                self.applied[g.tag] = c
                self.tx_uncertain.pop(g.tag, None)
                return True
        # Torn (keys from different transactions) or stale: both are failures.
        self.stale_read("multi", op, g.tag, got, [g.expected(c) for c in candidates])
        return False

    def run(self):
        try:
            rc = client(self.port)
        except Exception as e:  # noqa: BLE001
            self.error("connect", e)
            return
        while not self.stop.is_set():
            t = self.rng.choice(self.types)
            try:
                if t == "multi":
                    self.tx_write(rc)
                    if self.rng.random() < 0.5:
                        self.tx_read(rc, self.rng.choice(self.groups))
                else:
                    self.write(rc, t)
                    self.read(rc, t)
            except Exception as e:  # noqa: BLE001 - a read that raised
                self.error("read %s" % t, e)
        rc.close()


def _tx_reply(t, r):
    """A reply from inside EXEC in the form the plain command returns: redis-py's
    cluster transactions apply no response callbacks (HGETALL's flat list,
    ZRANGE WITHSCORES's flat list of strings)."""
    if t == "hash" and isinstance(r, list):
        return dict(zip(r[0::2], r[1::2]))
    if t == "set" and isinstance(r, list):
        return set(r)
    if t == "zset" and r and not isinstance(r[0], (list, tuple)):
        return [(m, float(s)) for m, s in zip(r[0::2], r[1::2])]
    return r


def _copy(v):
    return v.copy() if hasattr(v, "copy") else v


def _norm(v):
    """A comparable form of a reply or model content."""
    if isinstance(v, dict):
        return sorted((k, _norm(x)) for k, x in v.items())
    if isinstance(v, set):
        return sorted(v)
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float) and v == int(v):
        return ("num", int(v))
    if isinstance(v, int) and not isinstance(v, bool):
        return ("num", v)
    return v


def _jsonable(v):
    if isinstance(v, set):
        return sorted(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def verify(port, workers):
    """Reads every key back with a fresh client; returns (checked, lost samples, lost count, errors)."""
    rc = client(port)
    checked, lost, lost_count, errors = 0, [], 0, []
    for w in workers:
        during, before, samples_before = dict(w.stale), sum(w.stale.values()), len(w.stale_samples)
        w.sample_cap = samples_before + MAX_SAMPLES
        for t in w.data_types:
            for key in w.keys[t]:
                try:
                    w.read_whole(rc, t, key)
                except Exception as e:  # noqa: BLE001
                    errors.append({"op": "verify %s" % key, "type": type(e).__name__, "message": str(e)})
                    continue
                checked += 1
        for g in w.groups:
            w.tx_read(rc, g)
            checked += 1
        # A difference found by the final pass is a lost write, not a stale read.
        found = sum(w.stale.values()) - before
        lost_count += found
        lost.extend(w.stale_samples[samples_before:])
        w.stale_samples = w.stale_samples[:samples_before]
        w.stale = during
    rc.close()
    return checked, lost[:MAX_SAMPLES], lost_count, errors


def main():
    args = list(sys.argv[1:])
    types = list(ALL_TYPES)
    if "--types" in args:
        i = args.index("--types")
        types = [t for t in args[i + 1].split(",") if t]
        del args[i : i + 2]
    unknown = [t for t in types if t not in ALL_TYPES]
    if unknown or "string" not in types:
        sys.exit("--types: unknown %s (string is always on); known: %s" % (unknown, ALL_TYPES))
    port, stopfile, report_path = int(args[0]), args[1], args[2]
    threads = int(args[3]) if len(args) > 3 else 4
    count_redirects()
    print("run %s types %s" % (RUN, ",".join(types)), flush=True)
    stop = threading.Event()
    workers = [Worker(i, port, stop, types) for i in range(threads)]
    began = time.monotonic()
    for w in workers:
        w.thread.start()

    total = lambda d: sum(sum(w.__dict__[d].values()) for w in workers)  # noqa: E731
    started = False
    last_progress = 0.0
    while not os.path.exists(stopfile):
        if all(not w.thread.is_alive() for w in workers):
            break
        if not started and all(min(w.writes.values()) >= STARTED_AFTER for w in workers):
            started = True
            print("started", flush=True)
        now = time.monotonic()
        if now - last_progress >= 0.5:
            last_progress = now
            print(
                "progress writes=%d reads=%d errors=%d stale=%d"
                % (total("writes"), total("reads"), sum(w.error_count for w in workers), total("stale")),
                flush=True,
            )
        time.sleep(0.05)
    stop.set()
    for w in workers:
        w.thread.join(timeout=2 * SOCKET_TIMEOUT + 10)
    hung = [w.index for w in workers if w.thread.is_alive()]
    elapsed = time.monotonic() - began
    stale_during = total("stale")
    stale_samples = [s for w in workers for s in w.stale_samples][:MAX_SAMPLES]

    try:
        checked, lost, lost_count, verify_errors = verify(port, workers)
    except Exception:  # noqa: BLE001
        checked, lost, lost_count = 0, [], 0
        verify_errors = [{"op": "verify", "type": "exception", "message": traceback.format_exc()}]

    per_type = {
        t: {
            "writes": sum(w.writes[t] for w in workers),
            "reads": sum(w.reads[t] for w in workers),
            "stale": sum(w.stale[t] for w in workers),
        }
        for t in types
    }
    errors = [e for w in workers for e in w.errors] + verify_errors
    report = {
        "client": "redis-py %s" % redis.__version__,
        "types": types,
        "threads": threads,
        "seconds": round(elapsed, 1),
        "writes": sum(v["writes"] for v in per_type.values()),
        "reads": sum(v["reads"] for v in per_type.values()),
        "per_type": per_type,
        "keys": sum(len(w.model) + len(w.groups) for w in workers),
        "stale_reads": stale_during,
        "stale_samples": stale_samples,
        "phantom_reads": sum(w.phantom for w in workers),
        "phantom_samples": [s for w in workers for s in w.phantom_samples][:MAX_SAMPLES],
        "errors": sum(w.error_count for w in workers) + len(verify_errors),
        "error_samples": errors[:MAX_SAMPLES],
        "hung_threads": hung,
        "verified": checked,
        "lost": lost_count,
        "lost_samples": lost,
        "redirects": dict(redirects),
        "tx_redirected": sum(w.tx_redirected for w in workers),
        "max_op_ms": round(max(w.max_op_ms for w in workers), 1),
        "started": started,
    }
    with open(report_path + ".tmp", "w") as f:
        json.dump(report, f, indent=2)
    os.replace(report_path + ".tmp", report_path)
    print(
        "types workload (%s): %d writes, %d reads in %.1fs; %d stale, %d phantom, %d errors, "
        "%d/%d keys lost; %d MOVED, %d ASK, %d TRYAGAIN; slowest op %.0f ms; per type %s"
        % (
            report["client"],
            report["writes"],
            report["reads"],
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
            json.dumps(per_type),
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
