#!/bin/bash
# User-space instructions per query of sluice's relay, under callgrind (noise cannot move them):
# users mode in front of a local MariaDB, with digests and rules off (bare), with digests on, and
# with 100 regex rules that match nothing (rules), multiplexing (mux), the read/write split over
# the one server as its primary (split: mux plus the classifier) and bare with a traffic capture
# running (capture: recording, compression and writing, all of sluice's threads counted). Each configuration serves 1000 and then 3000
# point selects after a warm-up, counters zeroed after it; per query = the difference / 2000.
# Then passthrough (no [users]: sluice logs no one in and reads no statement) with digests off
# and with them counted there too (passthrough-digests), and passthrough serving sysbench's
# prepared point selects (passthrough-ps: COM_STMT_EXECUTE and binary rows, as the benchmark's
# suites send them; one sysbench thread). On request (HOTPATH_CONFIGS), the same prepared point
# selects through the benchmarks' byte forwarders, which do no protocol work: forward-epoll-ps
# (an epoll loop) and forward-tokio-ps (tokio's current-thread runtime, as each worker runs it).
#   HOTPATH_CONFIGS="passthrough-ps forward-tokio-ps forward-epoll-ps" bench/hotpath.sh
# HOTPATH_SLUICE names another sluice binary to measure, e.g. the profile-guided build:
#   scripts/pgo.sh && HOTPATH_SLUICE=target/pgo/release/sluice bench/hotpath.sh
#   bench/hotpath.sh            (needs valgrind: scripts/setup.sh valgrind)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$ROOT/bench/work/hotpath
SLUICE=$(realpath "${HOTPATH_SLUICE:-$ROOT/target/release/sluice}")
rm -rf "$WORK" && mkdir -p "$WORK"
"$ROOT/scripts/setup.sh" valgrind sysbench >/dev/null
cargo build --release -q -p sluice -p sluice-testkit --manifest-path "$ROOT/Cargo.toml"
"$ROOT/target/release/sluice-mariadb" --count 1 --dir "$WORK/db" > "$WORK/db.log" 2>&1 &
DB=$!
trap 'kill $DB 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do grep -q : "$WORK/db.log" && break; sleep 0.5; done
PORT=$(head -1 "$WORK/db.log" | sed 's/.*://')
mariadb -h127.0.0.1 -P"$PORT" -uapp -papppw test -e \
  "CREATE TABLE t (id INT PRIMARY KEY, c CHAR(120)); INSERT INTO t SELECT seq, REPEAT('x', 120) FROM seq_1_to_100"
sysbench oltp_point_select --mysql-host=127.0.0.1 --mysql-port="$PORT" --mysql-user=app --mysql-password=apppw \
  --mysql-db=test --tables=1 --table-size=1000 prepare > /dev/null
for n in 100 1000 3000; do
  python3 -c "import sys; print('\n'.join(f'SELECT c FROM t WHERE id={i % 100 + 1};' for i in range(int(sys.argv[1]))))" "$n" > "$WORK/q$n.sql"
done
base="tls = \"off\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n[[backends]]\naddress = \"127.0.0.1:$PORT\"\n[[users]]\nname = \"app\"\npassword = \"apppw\"\n[proxy]\nworkers = 1\n"
printf "$base[digests]\nenabled = false\n" > "$WORK/bare.toml"
pass="tls = \"off\"\n[[listeners]]\naddress = \"127.0.0.1:0\"\n[[backends]]\naddress = \"127.0.0.1:$PORT\"\n[proxy]\nworkers = 1\n"
printf "$pass[digests]\nenabled = false\n" > "$WORK/passthrough.toml"
printf "$pass[digests]\nenabled = true\n" > "$WORK/passthrough-digests.toml"
printf "$base[digests]\nenabled = true\n" > "$WORK/digests.toml"
printf "${base}multiplex = true\n[digests]\nenabled = false\n" > "$WORK/mux.toml"
printf "$base[digests]\nenabled = false\n[routing]\nsplit = true\n" > "$WORK/split.toml"
printf "$base[digests]\nenabled = false\n[capture]\ndir = \"$WORK/captures\"\n" > "$WORK/capture.toml"
{ printf "$base[digests]\nenabled = false\n"; for i in $(seq 0 99); do printf '[[rules]]\nname = "r%d"\nmatch = "^select nothing_%d from"\nblock = "no"\n' "$i" "$i"; done; } > "$WORK/rules.toml"

# n queries through sluice for configuration cfg on port: text point selects from the mariadb
# client, or sysbench's prepared ones (the -ps configurations).
queries() {
  local cfg=$1 port=$2 n=$3
  if [ "${cfg%-ps}" != "$cfg" ]; then
    sysbench oltp_point_select --mysql-host=127.0.0.1 --mysql-port="$port" --mysql-user=app --mysql-password=apppw \
      --mysql-db=test --tables=1 --table-size=1000 --threads=1 --time=0 --events="$n" run > /dev/null
  else
    mariadb -h127.0.0.1 -P"$port" -uapp -papppw test < "$WORK/q$n.sql" > /dev/null
  fi
}

# Instructions of sluice while it serves n queries (after the warm-up).
run() {
  local cfg=$1 n=$2 port=$((20000 + RANDOM % 20000)) admin=$((20000 + RANDOM % 20000))
  local extra=() cmd
  [ "$cfg" = capture ] && extra=(--admin "127.0.0.1:$admin")
  cmd=("$SLUICE" -c "$WORK/${cfg%-ps}.toml" --listen "127.0.0.1:$port" "${extra[@]}")
  local mode=${cfg#forward-}  # forward-MODE-ps: sluice-forward MODE in front of the server
  [ "$mode" != "$cfg" ] && cmd=("$ROOT/target/release/sluice-forward" "${mode%-ps}" "127.0.0.1:$PORT")
  valgrind --tool=callgrind --compress-strings=no --compress-pos=no --callgrind-out-file="$WORK/$cfg-$n.out" "${cmd[@]}" \
    > "$WORK/$cfg-$n.log" 2>&1 &
  local vp=$!
  if [ "$mode" != "$cfg" ]; then
    for _ in $(seq 1 200); do grep -q '^127' "$WORK/$cfg-$n.log" && break; sleep 0.3; done
    port=$(grep -m1 '^127' "$WORK/$cfg-$n.log" | sed 's/.*://')
  fi
  for _ in $(seq 1 200); do mariadb -h127.0.0.1 -P$port -uapp -papppw test -e "SELECT 1" >/dev/null 2>&1 && break; sleep 0.3; done
  queries "$cfg" "$port" 100
  if [ "$cfg" = capture ]; then  # (started after the warm-up, its sessions begun)
    rm -rf "$WORK/captures/capture-$n"
    curl -sf -XPOST -H "Content-Type: application/json" "http://127.0.0.1:$admin/capture/start" -d "{\"name\": \"capture-$n\"}" > /dev/null
    queries "$cfg" "$port" 100
  fi
  callgrind_control -z $vp > /dev/null 2>&1
  queries "$cfg" "$port" "$n"
  # (Stopped before the counters are read: its writer's last chunk is counted too.)
  [ "$cfg" = capture ] && curl -sf -XPOST -H "Content-Type: application/json" -d "{}" "http://127.0.0.1:$admin/capture/stop" > "$WORK/capture-$n.json"
  callgrind_control -d $vp > /dev/null 2>&1
  sleep 1
  kill -TERM $vp; wait $vp || true
  grep -h '^summary' "$(ls -t "$WORK/$cfg-$n.out".* | head -1)" | awk '{print $2}'
}
echo "| configuration | instructions per query | vs bare | vs mux |"
echo "|---|---|---|---|"
bare= mux=
for cfg in ${HOTPATH_CONFIGS:-bare digests rules mux split capture passthrough passthrough-digests passthrough-ps}; do
  a=$(run $cfg 1000); b=$(run $cfg 3000)
  per=$(( (b - a) / 2000 ))
  [ -z "$bare" ] && bare=$per
  [ "$cfg" = mux ] && mux=$per
  echo "| $cfg | $per | $(python3 -c "print(f'{$per / $bare:.3f}')") | $([ -n "$mux" ] && python3 -c "print(f'{$per / $mux:.3f}')") |"
done
