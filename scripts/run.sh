#!/usr/bin/env bash
# Runs sluice for real. With no --backend and no --config among the arguments, it first starts
# two local MariaDB servers of its own (data under .sluice/, loopback ports) as the backends.
# With --replicas N they are instead a primary and N replicas following it (GTID replication,
# replicas read-only), and the health checks' monitor user reads which is which.
# Usage: scripts/run.sh [--replicas N] [sluice arguments...]
# Then: mariadb -h127.0.0.1 -P6033 -uapp -papppw     (admin API: curl 127.0.0.1:6034/health)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -q -p sluice -p sluice-testkit
replicas=""
if [ "${1:-}" = "--replicas" ]; then replicas="${2:?--replicas N}"; shift 2; fi
args=("$@")
have_backend=no
for a in "$@"; do case "$a" in --backend|--backend=*|--config|--config=*|-c|check-config) have_backend=yes;; esac; done
if [ "$have_backend" = no ]; then
  mkdir -p .sluice
  topology=(--count 2); servers=2
  [ -n "$replicas" ] && { topology=(--replicas "$replicas"); servers=$((replicas + 1)); }
  target/release/sluice-mariadb "${topology[@]}" --dir "$PWD/.sluice/backends" > .sluice/backends.txt &
  backends_pid=$!
  trap 'kill $backends_pid 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    [ "$(wc -l < .sluice/backends.txt)" -ge "$servers" ] && break
    kill -0 $backends_pid 2>/dev/null || { echo "run: MariaDB backends failed to start" >&2; exit 1; }
    sleep 0.1
  done
  while read -r b; do args+=(--backend "$b"); done < .sluice/backends.txt
  echo "run: local MariaDB backends: $(paste -sd' ' .sluice/backends.txt) (users app/apppw, root via socket)" >&2
  has() { for a in "${args[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
  has --listen || args+=(--listen 127.0.0.1:6033)
  has --admin || args+=(--admin 127.0.0.1:6034)
  # The monitor user (made by the harness on every server) tells primary from replica.
  # (Its password in the environment, not on the command line that every local user sees.)
  if [ -n "$replicas" ] && ! has --monitor; then args+=(--monitor monitor); export SLUICE_MONITOR_PASSWORD=monitorpw; fi
fi
target/release/sluice "${args[@]}" &
sluice_pid=$!
trap 'kill -TERM $sluice_pid 2>/dev/null || true; wait $sluice_pid 2>/dev/null || true; kill ${backends_pid:-} 2>/dev/null || true' EXIT INT TERM
wait $sluice_pid
