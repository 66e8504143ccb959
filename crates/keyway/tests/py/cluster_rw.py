"""redis-py RedisCluster against a Keyway dev cluster.

usage: cluster_rw.py write|verify PORT FILE [N]
  write:  writes N random keys with random values, records every acknowledged
          pair in FILE (one "key value" per line, hex), reads each back.
  verify: reads every pair in FILE back and checks the value.
Exits non-zero on the first error.
"""
import os
import sys

from redis.cluster import RedisCluster


def main():
    mode, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rc = RedisCluster(host="127.0.0.1", port=port, decode_responses=False)
    if mode == "write":
        n = int(sys.argv[4])
        with open(path, "w") as out:
            for i in range(n):
                key = b"k:%d:" % i + os.urandom(8).hex().encode()
                value = os.urandom(16)
                assert rc.set(key, value) is True
                out.write("%s %s\n" % (key.hex(), value.hex()))
            out.flush()
            os.fsync(out.fileno())
        with open(path) as f:
            for line in f:
                k, v = (bytes.fromhex(x) for x in line.split())
                got = rc.get(k)
                assert got == v, "read back %r: %r != %r" % (k, got, v)
    elif mode == "verify":
        count = 0
        with open(path) as f:
            for line in f:
                k, v = (bytes.fromhex(x) for x in line.split())
                got = rc.get(k)
                assert got == v, "after restart %r: %r != %r" % (k, got, v)
                count += 1
        print("verified", count)
    else:
        raise SystemExit("unknown mode " + mode)
    rc.close()


if __name__ == "__main__":
    main()
