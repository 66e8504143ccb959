"""Runs GET app:1, SET app:1 x, GET other as an ACL user through redis-py.

usage: acl_user.py cluster|plain PORT USER PASSWORD
  cluster: RedisCluster seeded at PORT (a node); plain: Redis (the proxy).
  Prints one line per command: "<command> -> <value>" or "<command> -> ERR <message>".
"""
import sys

import redis
from redis.cluster import RedisCluster


def main():
    mode, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if mode == "cluster":
        r = RedisCluster(host="127.0.0.1", port=port, username=user, password=password)
    else:
        r = redis.Redis(host="127.0.0.1", port=port, username=user, password=password)
    for name, call in [
        ("GET app:1", lambda: r.get("app:1")),
        ("SET app:1 x", lambda: r.set("app:1", "x")),
        ("GET other", lambda: r.get("other")),
    ]:
        try:
            got = call()
            print(f"{name} -> {got.decode() if isinstance(got, bytes) else got}")
        except Exception as e:  # noqa: BLE001 - every error is reported
            print(f"{name} -> ERR {str(e).splitlines()[0]}")
    r.close()


if __name__ == "__main__":
    main()
