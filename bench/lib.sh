# Helpers shared by the bench scripts (sourced, not run).

# Sets KW to the keyway binary to measure: $KEYWAY_BIN when set, else the
# release build of this checkout (built now).
keyway_binary() {
  if [ -n "${KEYWAY_BIN:-}" ]; then
    KW=$KEYWAY_BIN
  else
    cargo build --release --bin keyway -q
    KW=./target/release/keyway
  fi
}

# redis_cluster_up DIR PORT MASTERS REPLICAS FSYNC PIDS
# Starts MASTERS * (1 + REPLICAS) redis-server processes on PORT, PORT+1, ...
# (AOF on, appendfsync FSYNC, data under DIR), appends their PIDs to the
# array named PIDS (they are stopped by PID, never by port or name), makes
# them one cluster with REPLICAS replicas per master, and returns once the
# cluster is ok and every replica is linked to its master.
redis_cluster_up() {
  local dir=$1 port=$2 masters=$3 replicas=$4 fsync=$5
  local -n pids_=$6
  local nodes=$((masters * (1 + replicas))) addrs=() i d
  for i in $(seq 0 $((nodes - 1))); do
    d="$dir/redis-$i"; mkdir -p "$d"
    redis-server --port $((port+i)) --cluster-enabled yes --cluster-config-file "$d/nodes.conf" \
      --dir "$d" --appendonly yes --appendfsync "$fsync" --save '' --logfile "$d/log" >/dev/null &
    pids_+=($!)
    addrs+=("127.0.0.1:$((port+i))")
  done
  for i in $(seq 0 $((nodes - 1))); do
    until redis-cli -p $((port+i)) ping >/dev/null 2>&1; do sleep 0.05; done
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$replicas" --cluster-yes >/dev/null
  until redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok'; do sleep 0.05; done
  if [ "$replicas" -gt 0 ]; then
    # Every replica linked to its master (else a run measures no replication).
    for i in $(seq 0 $((nodes - 1))); do
      until redis-cli -p $((port+i)) info replication | grep -qE 'role:master|master_link_status:up'; do sleep 0.05; done
    done
  fi
}

# keyway_steady DATA_DIR ADMIN_PORT NODES: waits (at most 10 s) until no
# node of a `keyway dev` keeps change records, the steady state of a
# cluster whose logs nobody reads (no replica, no migration): nodes stop
# writing them log_keep_idle_ms after the last reader. Nodes that do not
# say (an older binary) or keep them for a reader (replication) are
# waited for no longer than that.
keyway_steady() {
  local data=$1 admin=$2 nodes=$3 auth=() i kept
  [ -f "$data/cluster-secret" ] && auth=(-H "Authorization: Bearer $(cat "$data/cluster-secret")")
  for _ in $(seq 100); do
    kept=0
    for i in $(seq 0 $((nodes - 1))); do
      curl -s "${auth[@]}" "http://127.0.0.1:$((admin + i))/status" | grep -q '"records_kept":true' && kept=1
    done
    [ "$kept" = 0 ] && return 0
    sleep 0.1
  done
}
