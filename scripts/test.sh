#!/usr/bin/env bash
# Flotilla's one verify command: formatting, lints, and every test (unit, property,
# integration with real processes on loopback). CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Integration tests mount a small tmpfs to fill a disk; that needs root and mount(8).
if ! command -v mount >/dev/null 2>&1; then
    echo "scripts/test.sh: mount(8) is required (util-linux)" >&2
    exit 1
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
