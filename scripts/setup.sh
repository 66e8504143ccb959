#!/usr/bin/env bash
# Installs everything Keyway's tests need beyond the Rust toolchain (the
# build itself needs nothing else: no protoc, see vendor/etcd-client).
# Idempotent: safe to run again; it only installs what is missing, and it
# never stops a process (it starts none).
set -euo pipefail

need_apt=()
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need_apt+=(redis-tools)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
# ioredis (crates/keyway/tests/js) runs on Node.js.
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
# The dashboard test (crates/keyway/tests/it/dashboard.rs) loads /ui in headless Chromium.
[ -x /usr/bin/chromium ] || need_apt+=(chromium)

if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${need_apt[*]} with apt-get" >&2
  # Debian's packages start their services on install (redis-server,
  # etcd). Keyway's tests start their own, and this script never stops a
  # process it did not start, so it tells invoke-rc.d not to start any for
  # the length of the install (policy-rc.d exit 101), when no policy exists.
  policy=/usr/sbin/policy-rc.d
  made_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod +x "$policy"
    made_policy=1
  fi
  status=0
  $SUDO apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null ||
    status=$?
  [ -n "$made_policy" ] && $SUDO rm -f "$policy"
  [ "$status" -eq 0 ] || exit "$status"
fi

PY=${PYTHON:-python3}
if ! "$PY" -c 'import redis' >/dev/null 2>&1; then
  echo "setup: installing Python package redis" >&2
  "$PY" -m pip install -q 'redis>=5,<7'
fi

JS=crates/keyway/tests/js
if [ ! -d "$(dirname "$0")/../$JS/node_modules/ioredis" ]; then
  echo "setup: installing the Node.js test clients ($JS/package-lock.json)" >&2
  (cd "$(dirname "$0")/../$JS" && npm ci --no-audit --no-fund --silent)
fi

if ! command -v cargo-nextest >/dev/null 2>&1 && [ -n "${KEYWAY_WANT_NEXTEST:-}" ]; then
  cargo install --locked cargo-nextest
fi
echo "setup: ok ($(redis-cli --version | cut -d' ' -f1-2), python redis $("$PY" -c 'import redis; print(redis.__version__)'), node $(node --version))" >&2
