#!/usr/bin/env bash
# The Rust checks every commit must pass: formatting (cargo fmt --check) and clippy with warnings as
# errors over every target. Exits non-zero on the first that fails.
#   scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --check
cargo clippy --all-targets -- -D warnings
