#!/usr/bin/env bash
# Runs the whole test suite: unit tests, fuzz-corpus replays, and integration tests against real
# MariaDB servers that the harness starts itself on loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --locked "$@"
