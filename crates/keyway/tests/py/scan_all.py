"""What redis-py's RedisCluster makes of a cluster: its primaries and
replicas, and what it reads from "all primaries".

usage: scan_all.py PORT
  Prints "primaries <host:port,...>", "replicas <host:port,...>" (sorted),
  "scanned <n>" (distinct keys scan_iter returned) and "dbsize <n>"
  (DBSIZE sent to every primary, summed).
"""
import sys

from redis.cluster import RedisCluster


def main():
    port = int(sys.argv[1])
    rc = RedisCluster(host="127.0.0.1", port=port)
    addrs = lambda nodes: ",".join(sorted(f"{n.host}:{n.port}" for n in nodes))
    print("primaries " + addrs(rc.get_primaries()))
    print("replicas " + addrs(rc.get_replicas()))
    print(f"scanned {len(set(rc.scan_iter(count=100)))}")
    print(f"dbsize {rc.dbsize(target_nodes=RedisCluster.PRIMARIES)}")
    rc.close()


if __name__ == "__main__":
    main()
