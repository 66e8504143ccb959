#!/usr/bin/env bash
# Proves the README's first command needs only the Rust toolchain: builds the
# release binary with no `protoc` reachable (a PATH of symlinks to everything
# on the normal PATH except protoc; PROTOC and PROTOC_INCLUDE unset), starts
# `keyway dev` from it on free ports, checks it answers SET/GET, and stops it
# by its PID. redis-cli (installed for the tests) is the only other tool used.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; wait "$pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

bin="$work/bin"
mkdir "$bin"
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do
    name=$(basename "$f")
    [ "$name" = protoc ] && continue
    [ -x "$f" ] && [ ! -e "$bin/$name" ] && ln -s "$f" "$bin/$name"
  done
done
if env -u PROTOC PATH="$bin" bash -c 'command -v protoc' >/dev/null; then
  echo "check-no-protoc: protoc still reachable" >&2
  exit 1
fi

start=$(date +%s)
env -u PROTOC -u PROTOC_INCLUDE PATH="$bin" cargo build --release --locked -p keyway
echo "check-no-protoc: release build without protoc took $(($(date +%s) - start)) s" >&2

log="$work/dev.log"
env -u PROTOC PATH="$bin" target/release/keyway dev --data "$work/data" \
  --port 0 --admin-port 0 --meta-port 0 --manager-admin-port 0 >"$log" 2>&1 &
pid=$!
port=""
for _ in $(seq 1200); do
  port=$(sed -n 's/^Try:  redis-cli -c -p \([0-9]*\) .*/\1/p' "$log")
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "check-no-protoc: keyway dev exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log" >&2; echo "check-no-protoc: keyway dev not up after 120 s" >&2; exit 1; }
set_reply=$(redis-cli -c -p "$port" SET noprotoc:key "built without protoc")
get_reply=$(redis-cli -c -p "$port" GET noprotoc:key)
if [ "$set_reply" != OK ] || [ "$get_reply" != "built without protoc" ]; then
  cat "$log" >&2
  echo "check-no-protoc: SET replied '$set_reply', GET replied '$get_reply'" >&2
  exit 1
fi
kill "$pid"
status=0
wait "$pid" || status=$?
pid=""
grep -q '^stopped$' "$log" || { cat "$log" >&2; echo "check-no-protoc: keyway dev did not stop cleanly (status $status)" >&2; exit 1; }
echo "check-no-protoc: keyway dev (release, built without protoc) served SET -> $set_reply, GET -> $get_reply on port $port, stopped by PID" >&2
