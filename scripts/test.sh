#!/usr/bin/env bash
# Keyway's full test suite, from a fresh clone: installs what the tests need
# beyond cargo (scripts/setup.sh, idempotent), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# setup.sh never stops a process it did not start (it starts none):
# checked before it runs.
if grep -nE '\b(pkill|killall)\b' scripts/setup.sh; then
  echo "test: scripts/setup.sh must not pkill/killall" >&2
  exit 1
fi
bash scripts/setup.sh
# The vendored etcd-client differs from upstream only in its build script.
bash scripts/check-vendor.sh
# The manager links neither keyway-node nor fjall (the crate boundaries).
bash scripts/check-deps.sh
# The README's first command needs only the Rust toolchain: a release build
# with no protoc reachable, and `keyway dev` from it serving SET/GET.
bash scripts/check-no-protoc.sh
export RUST_BACKTRACE=1
# A fresh clone gains nothing from incremental caches, and they cost disk
# (CI's ran out once): off unless the caller asks for them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The vendored fjall's worker-pool tests, which cover Keyway's patches there
# (vendor/fjall/KEYWAY-PATCH.md). The crate is outside the workspace, so it
# has a lock of its own for its tests (KEYWAY-test.lock: the workspace's
# versions plus fjall's dev-dependencies), used --locked and removed after.
cp vendor/fjall/KEYWAY-test.lock vendor/fjall/Cargo.lock
trap 'rm -f vendor/fjall/Cargo.lock' EXIT
cargo test --locked --manifest-path vendor/fjall/Cargo.toml --target-dir target/vendor-fjall --lib worker_pool
rm -f vendor/fjall/Cargo.lock
# Integration tests spawn clusters; two at a time keeps a 2-core machine responsive.
cargo test --workspace --locked -- --test-threads="${KEYWAY_TEST_THREADS:-2}"
