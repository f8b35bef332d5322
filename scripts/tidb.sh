#!/usr/bin/env bash
# Builds a standalone tidb-server (TiDB with its embedded store) from the Go module proxy, once:
# the binary is cached under target/testkit/tidb and its path printed. The TiDB tests and the
# benchmark's TiDB suite start it (crates/testkit/src/tidb.rs).
#
# The version is the one TiProxy's own go.mod pins. TiDB's parser is a module of its own that
# the download of TiDB leaves out (TiDB's go.mod replaces it with ./pkg/parser), so it is put
# there before building.
set -euo pipefail
cd "$(dirname "$0")/.."
TIDB_VERSION=v1.1.0-beta.0.20250826122210-36a2af4b10b4
PARSER_VERSION=v0.0.0-20250828103858-8d1a00e351ad
root=${SLUICE_TESTKIT_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/testkit}
out="$root/tidb/tidb-server-${TIDB_VERSION##*-}"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
go=/usr/local/go/bin/go
[ -x "$go" ] || go=$(command -v go) || { echo "tidb: Go (1.23 or later) is required to build tidb-server" >&2; exit 1; }
# The module and build caches are the testkit's (the Go driver's suite uses them too).
export GOPATH="$root/go/path" GOMODCACHE="$root/go/path/pkg/mod" GOCACHE="$root/go/cache"
export GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0
mkdir -p "$root/tidb" "$GOPATH"
exec 9>"$root/tidb/build.lock"
flock 9
[ -x "$out" ] && { echo "$out"; exit 0; }
dir() { (cd "$root/go" && "$go" mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'); }
echo "tidb: downloading github.com/pingcap/tidb@$TIDB_VERSION" >&2
tidb=$(dir "github.com/pingcap/tidb@$TIDB_VERSION")
parser=$(dir "github.com/pingcap/tidb/pkg/parser@$PARSER_VERSION")
[ -d "$tidb" ] && [ -d "$parser" ] || { echo "tidb: the Go module proxy did not give TiDB's sources" >&2; exit 1; }
src="$root/tidb/src"
rm -rf "$src"
cp -r "$tidb" "$src"
chmod -R u+w "$src"
rm -rf "$src/pkg/parser"
cp -r "$parser" "$src/pkg/parser"
chmod -R u+w "$src/pkg/parser"
echo "tidb: building tidb-server (some minutes on two cores)" >&2
start=$(date +%s)
(cd "$src" && "$go" build -trimpath -o "$out.tmp" ./cmd/tidb-server)
mv "$out.tmp" "$out"
rm -rf "$src"
echo "tidb: built in $(( $(date +%s) - start )) s" >&2
echo "$out"
