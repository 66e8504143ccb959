#!/usr/bin/env bash
# Proves vendor/etcd-client is etcd-client 0.21.1 from crates.io changed only
# where vendor/etcd-client/KEYWAY-PATCH.md says: build.rs replaced, three lines
# added to Cargo.toml, Cargo.lock removed, the two KEYWAY-* files added.
#
# 1. Every other file matches KEYWAY-UPSTREAM.sha256 (the upstream crate's
#    file hashes), and no file is added or missing.
# 2. When the upstream .crate is in cargo's cache (any machine that built
#    Keyway before the patch, or ran `cargo fetch` on etcd-client), it is
#    checked against crates.io's checksum and compared file by file, which
#    also proves KEYWAY-UPSTREAM.sha256 itself was not edited.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=vendor/etcd-client
crate_sha=c46b85f82f5189ce66d901425833ee2d94440a571e8071252db5776cc66dea63
changed='^\./(build\.rs|Cargo\.toml|Cargo\.lock)$'
fail() { echo "check-vendor: $*" >&2; exit 1; }

manifest=$dir/KEYWAY-UPSTREAM.sha256
(cd "$dir" && grep -Ev "  ${changed#^}" KEYWAY-UPSTREAM.sha256 | sha256sum --quiet -c -) ||
  fail "$dir differs from upstream etcd-client 0.21.1 (see above)"
want=$(sed 's/^[0-9a-f]*  //' "$manifest" | grep -Ev "$changed" | LC_ALL=C sort)
have=$(cd "$dir" && find . -type f ! -name 'KEYWAY-*' | LC_ALL=C sort | grep -Ev "$changed")
[ "$want" = "$have" ] || fail "files added or removed in $dir: $(diff <(echo "$want") <(echo "$have") | grep '^[<>]' | tr '\n' ' ')"
[ ! -e "$dir/Cargo.lock" ] || fail "$dir/Cargo.lock should not exist (the workspace's lock applies)"
# Cargo.toml: upstream plus the protox build-dependency, nothing else.
upstream_toml=$(grep '  ./Cargo.toml$' "$manifest" | cut -d' ' -f1)
stripped_toml=$(awk '
  /^# Keyway: / {skip=3; next}
  skip > 0 {skip--; next}
  {print}' "$dir/Cargo.toml" | sha256sum | cut -d' ' -f1)
[ "$stripped_toml" = "$upstream_toml" ] || fail "$dir/Cargo.toml differs from upstream beyond the protox block"

crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/etcd-client-0.21.1.crate 2>/dev/null | head -1 || true)
if [ -n "$crate" ]; then
  [ "$(sha256sum "$crate" | cut -d' ' -f1)" = "$crate_sha" ] || fail "$crate does not have crates.io's checksum"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$crate" -C "$tmp"
  (cd "$tmp/etcd-client-0.21.1" && find . -type f | LC_ALL=C sort | xargs sha256sum) |
    cmp -s - "$manifest" || fail "$manifest does not match the upstream crate $crate"
  echo "check-vendor: $dir = etcd-client 0.21.1 ($crate checked) except build.rs and the protox build-dependency" >&2
else
  echo "check-vendor: $dir = etcd-client 0.21.1 per $manifest except build.rs and the protox build-dependency (upstream .crate not cached, not compared)" >&2
fi
