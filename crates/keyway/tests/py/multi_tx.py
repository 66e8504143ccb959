"""redis-py RedisCluster transactions against a Keyway node (multi_live.rs).

usage: multi_tx.py PORT
"""
import sys

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError, WatchError

port = int(sys.argv[1])
rc = RedisCluster(host="127.0.0.1", port=port)
other = RedisCluster(host="127.0.0.1", port=port)

# A transaction: its commands' replies in order, later ones see earlier writes.
with rc.pipeline(transaction=True) as p:
    p.set("{u}a", 1)
    p.incr("{u}a")
    p.get("{u}a")
    res = p.execute(raise_on_error=False)
OK = (True, b"OK")
assert res[0] in OK and res[1] == 2 and res[2] == b"2", res

# WATCH, unchanged key: the transaction runs.
with rc.pipeline(transaction=True) as p:
    p.watch("{u}w")
    before = p.get("{u}w")
    p.multi()
    p.set("{u}w", "mine")
    assert p.execute()[0] in OK
assert rc.get("{u}w") == b"mine"

# WATCH, key changed by another client in between: WatchError, nothing ran.
with rc.pipeline(transaction=True) as p:
    p.watch("{u}w")
    p.get("{u}w")
    other.set("{u}w", "theirs")
    p.multi()
    p.set("{u}w", "mine-again")
    p.set("{u}side", "effect")
    try:
        p.execute()
        raise AssertionError("EXEC ran although a watched key changed")
    except WatchError:
        pass
assert rc.get("{u}w") == b"theirs"
assert rc.get("{u}side") is None

# WATCH, key expiring in between: WatchError.
rc.set("{u}e", "v", px=50)
with rc.pipeline(transaction=True) as p:
    p.watch("{u}e")
    import time
    deadline = time.time() + 5
    while rc.exists("{u}e") and time.time() < deadline:
        time.sleep(0.01)
    p.multi()
    p.set("{u}e2", "x")
    try:
        p.execute()
        raise AssertionError("EXEC ran although a watched key expired")
    except WatchError:
        pass
assert rc.get("{u}e2") is None

# A runtime error inside the transaction is one reply; the rest still run.
with rc.pipeline(transaction=True) as p:
    p.set("{u}s", "notanumber")
    p.incr("{u}s")
    p.set("{u}t", "ok")
    res = p.execute(raise_on_error=False)
assert res[0] in OK and isinstance(res[1], ResponseError) and res[2] in OK, res

# A queue-time error (wrong arity) aborts the whole transaction.
with rc.pipeline(transaction=True) as p:
    p.set("{u}q", "1")
    p.execute_command("GET", "{u}q", "extra")
    try:
        p.execute()
        raise AssertionError("EXEC ran after a queue-time error")
    except ResponseError:
        pass
assert rc.get("{u}q") is None

print("multi_tx ok")
