#!/usr/bin/env bash
# Runs Redis 7.0's own Tcl test suite (unit files) against a one-node
# `keyway dev` in cluster mode, and prints per file the pass/fail counts.
#
#   scripts/redis-suite.sh                      # the default files below
#   scripts/redis-suite.sh unit/type/string.tcl unit/expire.tcl
#
# The suite is not in this repository: it ships in Debian's source package
# `redis` (7.0.15 on this machine's Debian), which this script fetches once
# with `apt-get source` (adding a deb-src entry if none exists) into
# $KEYWAY_REDIS_SUITE_DIR (default ~/.cache/keyway/redis-suite). It then starts
# one `keyway dev --nodes 1` on free loopback ports with its own data
# directory, runs `./runtest --host --port --cluster-mode --ignore-encoding
# --ignore-digest --single FILE` per file (tests tagged needs:debug,
# needs:repl, needs:config-maxmemory and needs:other-db are skipped, as are
# those that need a second database), and stops the node it started (by PID)
# when it exits. A file that aborts (runtest stops a file at an exception)
# is reported with the test it stopped at; the script goes on with the next.
#
# Logs: $KEYWAY_REDIS_SUITE_OUT (default target/redis-suite/): one
# <file>.log per test file (runtest's output), failures.log (every failing
# test, by file), keyway.log (the node's output), summary.txt.
#
# Environment: KEYWAY_BIN (a built keyway binary; default: cargo build -p
# keyway and use target/debug/keyway), KEYWAY_REDIS_SUITE_DIR,
# KEYWAY_REDIS_SUITE_OUT, KEYWAY_REDIS_SUITE_TIMEOUT_S (per file, default 600).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

DEFAULT_FILES=(
  unit/type/hash.tcl unit/type/list.tcl unit/type/set.tcl unit/type/zset.tcl
  unit/type/incr.tcl unit/type/string.tcl unit/expire.tcl unit/keyspace.tcl
  unit/multi.tcl
)
files=("$@")
[ ${#files[@]} -eq 0 ] && files=("${DEFAULT_FILES[@]}")

cache=${KEYWAY_REDIS_SUITE_DIR:-$HOME/.cache/keyway/redis-suite}
out=${KEYWAY_REDIS_SUITE_OUT:-$repo/target/redis-suite}
per_file_timeout_s=${KEYWAY_REDIS_SUITE_TIMEOUT_S:-600}
mkdir -p "$cache" "$out"

log() { echo "redis-suite: $*" >&2; }

# --- 1. the suite: Debian's source package `redis` -------------------------
fetch_suite() {
  local src
  src=$(find "$cache" -maxdepth 2 -name runtest -path '*/redis-*/runtest' 2>/dev/null | head -n1)
  if [ -n "$src" ]; then
    dirname "$src"
    return 0
  fi
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  command -v dpkg-source >/dev/null 2>&1 || {
    log "installing dpkg-dev (for apt-get source)"
    $SUDO apt-get update -qq >&2 &&
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends dpkg-dev >&2 ||
      return 1
  }
  command -v tclsh >/dev/null 2>&1 || {
    log "installing tcl (runtest's interpreter)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends tcl >&2 || return 1
  }
  if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding a deb-src entry (/etc/apt/sources.list.d/keyway-deb-src.sources)"
    # The same archives as the binary entries (Debian's own .sources file).
    local base=/etc/apt/sources.list.d/debian.sources
    if [ -f "$base" ]; then
      sed -e 's/^Types: deb$/Types: deb-src/' "$base" |
        $SUDO tee /etc/apt/sources.list.d/keyway-deb-src.sources >/dev/null
    else
      local codename
      codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
      printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb-src\nURIs: http://deb.debian.org/debian-security\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$codename" "$codename" "$codename" |
        $SUDO tee /etc/apt/sources.list.d/keyway-deb-src.sources >/dev/null
    fi
    $SUDO apt-get update -qq >&2 || return 1
  elif ! apt-cache showsrc redis >/dev/null 2>&1 || [ -z "$(apt-cache showsrc redis 2>/dev/null)" ]; then
    $SUDO apt-get update -qq >&2 || return 1
  fi
  # The version of the installed redis-server when there is one (the suite
  # must match the server the differential tests use), else the newest.
  local want="redis"
  local installed
  installed=$(dpkg-query -W -f='${Version}' redis-server 2>/dev/null || true)
  [ -n "$installed" ] && want="redis=$installed"
  log "apt-get source $want into $cache"
  (cd "$cache" && apt-get source -qq --download-only "$want" >&2 ||
    apt-get source -qq --download-only redis >&2) || return 1
  (cd "$cache" && dpkg-source --no-check -x ./redis_*.dsc >&2) || return 1
  src=$(find "$cache" -maxdepth 2 -name runtest -path '*/redis-*/runtest' | head -n1)
  [ -n "$src" ] || { log "no runtest in the unpacked source"; return 1; }
  dirname "$src"
}

# --- 2. one `keyway dev` node on free ports -----------------------------------
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

node_pid=""
node_data=""
stop_node() {
  if [ -n "$node_pid" ] && kill -0 "$node_pid" 2>/dev/null; then
    kill -INT "$node_pid" 2>/dev/null
    for _ in $(seq 1 100); do
      kill -0 "$node_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$node_pid" 2>/dev/null && kill -KILL "$node_pid" 2>/dev/null
    wait "$node_pid" 2>/dev/null
  fi
  node_pid=""
  [ -n "$node_data" ] && rm -rf "$node_data"
  node_data=""
}
trap stop_node EXIT
trap 'exit 130' INT TERM

start_node() {
  local bin=$1
  port=$(free_port)
  local meta_port
  meta_port=$(free_port)
  while [ "$meta_port" = "$port" ]; do meta_port=$(free_port); done
  node_data=$(mktemp -d "${TMPDIR:-/tmp}/keyway-redis-suite.XXXXXX")
  "$bin" dev --nodes 1 --replication-factor 1 --partitions-per-node 4 \
    --host 127.0.0.1 --port "$port" --meta-port "$meta_port" \
    --admin-port 0 --manager-admin-port 0 --data "$node_data" \
    --no-auto-split --no-auto-merge --no-rebalance \
    >>"$out/keyway.log" 2>&1 &
  node_pid=$!
  log "keyway dev (pid $node_pid) on 127.0.0.1:$port, data $node_data"
  # Up when it serves a write on every partition: the four slots below sit in
  # the four partitions of a fresh one-node map.
  local deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$node_pid" 2>/dev/null || { log "keyway dev exited (see $out/keyway.log)"; return 1; }
    local all=1
    for k in '{a}' '{b}' '{c}' '{d}' '{e}' '{f}'; do
      [ "$(redis-cli -h 127.0.0.1 -p "$port" set "redis-suite-probe$k" 1 2>/dev/null)" = OK ] || { all=0; break; }
    done
    if [ $all = 1 ]; then
      for k in '{a}' '{b}' '{c}' '{d}' '{e}' '{f}'; do
        redis-cli -h 127.0.0.1 -p "$port" del "redis-suite-probe$k" >/dev/null 2>&1
      done
      return 0
    fi
    sleep 0.2
  done
  log "keyway dev did not come up in 60 s (see $out/keyway.log)"
  return 1
}

# --- 3. run each file ------------------------------------------------------
suite=$(fetch_suite) || { log "could not fetch the Redis test suite"; exit 2; }
log "suite: $suite"
bin=${KEYWAY_BIN:-}
if [ -z "$bin" ]; then
  cargo build -q -p keyway || exit 2
  bin=$repo/target/debug/keyway
fi
: >"$out/keyway.log"
start_node "$bin" || exit 2

: >"$out/failures.log"
summary="$out/summary.txt"
printf '%-24s %6s %6s %8s  %s\n' file passed failed skipped result >"$summary"
total_pass=0 total_fail=0 all_ok=1
for f in "${files[@]}"; do
  unit=${f%.tcl}
  name=$(echo "$unit" | tr '/' '_')
  flog="$out/$name.log"
  if [ ! -f "$suite/tests/$unit.tcl" ]; then
    printf '%-24s %6s %6s %8s  %s\n' "$unit" - - - "no such file" | tee -a "$summary"
    all_ok=0
    continue
  fi
  kill -0 "$node_pid" 2>/dev/null || start_node "$bin" || exit 2
  # A random --baseport: runtest's own test-server port (baseport - 32)
  # would otherwise clash with another run of this script on the machine.
  baseport=$((30000 + RANDOM % 20000))
  (cd "$suite" && timeout "$per_file_timeout_s" ./runtest --host 127.0.0.1 --port "$port" \
    --baseport "$baseport" --cluster-mode --ignore-encoding --ignore-digest \
    --tags "-needs:debug -needs:repl -needs:config-maxmemory -needs:other-db" \
    --single "$unit" ${KEYWAY_REDIS_SUITE_ARGS:-}) >"$flog" 2>&1
  rc=$?
  # runtest colours its status words; strip ANSI escapes before counting.
  clean=$(sed -e 's/\x1b\[[0-9;]*m//g' "$flog")
  passed=$(grep -c '^\[ok\]: ' <<<"$clean")
  failed=$(grep -c '^\[err\]: ' <<<"$clean")
  skipped=$(grep -cE '^\[(ignore|skip)\]: ' <<<"$clean")
  if grep -q '^\[exception\]: ' <<<"$clean"; then
    # The test it stopped in: the innermost `test {name}` in the error trace.
    at=$(grep -oE 'invoked from within\s*$|^"test \{[^}]*\}|^"test "[^"]*"' <<<"$clean" | grep -v invoked | head -n1 | sed -E 's/^"test [{"]//; s/[}"]$//')
    last=$(grep -E '^\[(ok|err)\]: ' <<<"$clean" | tail -n1 | sed -E 's/^\[(ok|err)\]: //; s/ \([0-9]+ ms\)$//')
    why=$(grep -m1 -A1 '^\[exception\]: ' <<<"$clean" | tr '\n' ' ' | cut -c1-200)
    if [ -n "$at" ]; then
      at="in '$at'"
    else
      # Outside any test (a loop or setup between tests): its innermost command.
      at="outside a test, at '$(grep -m1 -A1 'invoked from within' <<<"$clean" | tail -n1 | tr -d '"' | cut -c1-80)'"
    fi
    result="ABORTED $at (after '${last:-nothing}'): $why"
    failed=$((failed + 1))
  elif [ $rc -eq 124 ]; then
    result="TIMEOUT after ${per_file_timeout_s}s"
    failed=$((failed + 1))
  elif grep -q 'All tests passed without errors' <<<"$clean"; then
    result="ok"
  else
    result="FAILED (runtest exit $rc)"
  fi
  [ "$result" = ok ] || all_ok=0
  total_pass=$((total_pass + passed))
  total_fail=$((total_fail + failed))
  printf '%-24s %6d %6d %8d  %s\n' "$unit" "$passed" "$failed" "$skipped" "$result" | tee -a "$summary"
  {
    echo "== $unit: $passed passed, $failed failed, $skipped skipped: $result"
    grep -E '^\[err\]: ' <<<"$clean" | sed 's/^/   /'
    grep -A3 '^\[exception\]: ' <<<"$clean" | sed 's/^/   /'
  } >>"$out/failures.log"
done
echo "redis-suite: $total_pass passed, $total_fail failed" | tee -a "$summary"
log "logs in $out (failures.log, one <file>.log per test file, keyway.log)"
[ $all_ok = 1 ]
