#!/usr/bin/env bash
# Runs the whole test suite: unit tests, fuzz-corpus replays, and integration tests against real
# MariaDB servers that the harness starts itself on loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
# sysbench (and a C compiler for its reconnect shim) drive the failover-under-load tests.
scripts/setup.sh sysbench gcc libc6-dev etcd-server openssl
# A standalone tidb-server (TiDB with its embedded store) for the TiDB tests, built from the Go
# module proxy once and cached (some minutes the first time).
scripts/tidb.sh >/dev/null
# Chromium, Node.js and playwright-core drive the web dashboard's browser test (Node.js also
# runs the mysql2 driver's behaviours, tests/node_driver.rs).
scripts/browser.sh >/dev/null
# A Python with venv and pip runs SQLAlchemy's suite over PyMySQL (tests/orm_suite.rs installs
# both, and pytest, from PyPI into target/testkit/python).
python3 -c "import venv, ensurepip" 2>/dev/null || scripts/setup.sh python3-venv python3-pip
cargo test --workspace --locked "$@"
