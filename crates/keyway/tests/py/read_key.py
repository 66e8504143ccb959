"""Reads one key N times through redis-py's RedisCluster(read_from_replicas=True).

usage: read_key.py PORT KEY N
  Prints one line per read: "GOT <value>", "NIL" or "ERR <message>".
"""
import sys
import warnings

from redis.cluster import RedisCluster


def main():
    port, key, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read_from_replicas is deprecated in redis-py 6
        rc = RedisCluster(host="127.0.0.1", port=port, read_from_replicas=True)
    for _ in range(n):
        try:
            got = rc.get(key)
            print("NIL" if got is None else "GOT " + got.decode())
        except Exception as e:  # noqa: BLE001 - every error is reported
            print("ERR " + str(e).splitlines()[0])
    rc.close()


if __name__ == "__main__":
    main()
