#!/usr/bin/env bash
# A profile-guided build of sluice (PGO): an instrumented sluice serves a training load, and the
# compiler lays out and inlines the relay (and tokio, and every crate under it) by what that load
# ran. Hot code ends up together and branches fall through on the common path: fewer
# instructions per query and fewer instruction-cache lines, the cost sluice pays over a byte
# forwarder when the database shares its cores (docs/PERFORMANCE.md measures it).
#
#   scripts/pgo.sh                  writes target/pgo/release/sluice
#   PGO_SECONDS=2 scripts/pgo.sh    a shorter training (each of its runs lasts PGO_SECONDS)
#
# The training load: sysbench through sluice in front of a local MariaDB server the script
# starts (sluice-mariadb), in passthrough, in users mode and with multiplexing; prepared point
# selects, read-only and read-write transactions, and point selects and read-only as text
# queries. Nothing of sluice's code is different: the same sources, built twice more (under
# target/pgo-gen, instrumented, and target/pgo), so the plain release build stays as it is.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$ROOT/target/pgo-work
SECONDS_EACH=${PGO_SECONDS:-5}
rm -rf "$WORK" && mkdir -p "$WORK/raw"
# llvm-profdata of the compiler's own LLVM version (a profile's format follows it): the
# toolchain's (rustup's llvm-tools) when it has it, else Debian's package of that version.
LLVM=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata
packages=(sysbench)
if [ ! -x "$PROFDATA" ]; then
  packages+=("llvm-$LLVM")
  PROFDATA=/usr/lib/llvm-$LLVM/bin/llvm-profdata
fi
"$ROOT/scripts/setup.sh" "${packages[@]}" >/dev/null

cd "$ROOT"
cargo build --release -q -p sluice-testkit
RUSTFLAGS="-Cprofile-generate=$WORK/raw" cargo build --release -q -p sluice --target-dir "$ROOT/target/pgo-gen"

target/release/sluice-mariadb --count 1 --dir "$WORK/db" > "$WORK/db.log" 2>&1 &
DB=$!
SLUICE=
trap 'kill $DB $SLUICE 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do grep -q : "$WORK/db.log" && break; sleep 0.5; done
PORT=$(head -1 "$WORK/db.log" | sed 's/.*://')
[ -n "$PORT" ] || { echo "pgo: the MariaDB server did not start; see $WORK/db.log" >&2; exit 1; }
SB=(--mysql-host=127.0.0.1 --mysql-user=app --mysql-password=apppw --mysql-db=test --tables=2 --table-size=10000)
sysbench oltp_read_write "${SB[@]}" --mysql-port="$PORT" prepare > /dev/null

# The configurations trained: passthrough as the benchmarks run it (command-line flags), users
# mode, and users mode multiplexing sessions over a few connections.
users="[[listeners]]\naddress = \"127.0.0.1:LISTEN\"\n[[backends]]\naddress = \"127.0.0.1:$PORT\"\n[[users]]\nname = \"app\"\npassword = \"apppw\"\n"
printf "${users}[proxy]\nworkers = 1\n" > "$WORK/users.toml"
printf "${users}[proxy]\nworkers = 1\nmultiplex = true\nmax_backend_connections = 4\n" > "$WORK/mux.toml"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

train() {
  local mode=$1 port
  port=$(free_port)
  if [ "$mode" = passthrough ]; then
    target/pgo-gen/release/sluice --listen "127.0.0.1:$port" --backend "127.0.0.1:$PORT" --workers 1 > "$WORK/$mode.log" 2>&1 &
  else
    sed "s/LISTEN/$port/" "$WORK/$mode.toml" > "$WORK/$mode-run.toml"
    target/pgo-gen/release/sluice -c "$WORK/$mode-run.toml" > "$WORK/$mode.log" 2>&1 &
  fi
  SLUICE=$!
  for _ in $(seq 1 100); do mariadb -h127.0.0.1 -P"$port" -uapp -papppw test -e "SELECT 1" > /dev/null 2>&1 && break; sleep 0.2; done
  for run in "oltp_point_select" "oltp_read_only" "oltp_read_write" \
             "oltp_point_select --db-ps-mode=disable" "oltp_read_only --db-ps-mode=disable"; do
    # (read_write's deadlocks and duplicate keys are errors the load may meet: it goes on.)
    # shellcheck disable=SC2086
    sysbench $run "${SB[@]}" --mysql-port="$port" --threads=8 --time="$SECONDS_EACH" --mysql-ignore-errors=all run > /dev/null
  done
  # A clean exit writes the profile (at exit, of the process).
  kill -TERM $SLUICE
  wait $SLUICE || true
  SLUICE=
  echo "pgo: trained $mode" >&2
}
for mode in passthrough users mux; do train $mode; done

ls "$WORK"/raw/*.profraw > /dev/null
"$PROFDATA" merge -o "$WORK/sluice.profdata" "$WORK/raw"
# Named by its content: cargo rebuilds when the flags change, not when a file they name does.
PROFILE=$ROOT/target/pgo-profiles/$(sha256sum "$WORK/sluice.profdata" | cut -c1-16).profdata
rm -rf "$ROOT/target/pgo-profiles" && mkdir -p "$ROOT/target/pgo-profiles" && mv "$WORK/sluice.profdata" "$PROFILE"
RUSTFLAGS="-Cprofile-use=$PROFILE" cargo build --release -q -p sluice --target-dir "$ROOT/target/pgo"
echo "target/pgo/release/sluice"
