"""redis-py RedisCluster(read_from_replicas=True) against a replicated Keyway cluster.

usage: replica_reads.py PORT KEYS ROUNDS
  Writes KEYS keys, then overwrites each ROUNDS times, every value unique;
  after each acknowledged write it reads the key back twice (redis-py
  spreads reads over the slot's primary and its replicas, round robin, on
  READONLY connections) and counts a read that does not return the value
  just acknowledged as stale. Prints "reads N stale S" and exits non-zero
  if S > 0 or on any error a client should not see.
"""
import os
import sys
import warnings

from redis.cluster import RedisCluster


def main():
    port, keys, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    with warnings.catch_warnings():
        # read_from_replicas is deprecated in redis-py 6 in favour of
        # load_balancing_strategy; it is the documented way to read from
        # replicas in every version this project supports (5 and 6).
        warnings.simplefilter("ignore")
        rc = RedisCluster(
            host="127.0.0.1", port=port, decode_responses=False, read_from_replicas=True
        )
    print("replicas known at start %d" % len(rc.get_replicas()))
    run = os.urandom(4).hex().encode()
    reads = stale = 0
    names = [b"rr:%s:%d" % (run, i) for i in range(keys)]
    for r in range(rounds + 1):
        for i, key in enumerate(names):
            value = b"%s:%d:%d" % (run, i, r)
            assert rc.set(key, value) is True
            for _ in range(2):
                got = rc.get(key)
                reads += 1
                if got != value:
                    stale += 1
                    print("stale read %r: %r, acknowledged %r" % (key, got, value))
    print("replicas known at end %d" % len(rc.get_replicas()))
    print("reads %d stale %d" % (reads, stale))
    rc.close()
    sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
