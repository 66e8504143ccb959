#!/usr/bin/env bash
# Keeps the crate boundaries of docs/ARCHITECTURE.md ("Crates and the
# dependency rule"): the manager talks to nodes through keyway-peer and must
# not link the node (its executor, axum handlers) nor the fjall engine; nor
# may the shared crates it and the proxy build on.
# `cargo tree` resolves each crate's normal dependencies with only the
# features it asks for, as a build of that crate alone would.
set -euo pipefail
cd "$(dirname "$0")/.."
# keyway-proxy joins this list once it no longer links keyway-node (see
# ARCHITECTURE.md: the data-command parsers `cmd::parse` are still there).
crates=(keyway-manager keyway-peer keyway-command keyway-tls)
status=0
for crate in "${crates[@]}"; do
  tree=$(cargo tree --locked -p "$crate" -e normal --prefix none)
  found=$(grep -E '^(keyway-node|fjall) ' <<<"$tree" | sort -u || true)
  if [ -n "$found" ]; then
    echo "check-deps: $crate links what it must not:" >&2
    echo "$found" >&2
    status=1
  fi
done
[ "$status" = 0 ] && echo "check-deps: ${crates[*]} link neither keyway-node nor fjall" >&2
exit "$status"
