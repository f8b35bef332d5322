#!/usr/bin/env python3
"""CPU per query of two or more sluice binaries, and of the tokio byte forwarder and HAProxy, in
front of one tidb-server (or MariaDB server): what a change on the hot path costs or saves
where the proxy's data is cold at every query (the server shares the two cores and evicts it),
with the targets interleaved in every round, their order rotating, so that the host's noise
falls on all of them alike.

    bench/versus.py [--rounds N] [--duration S] [--threads T] [--rows R] [--mariadb]
                    NAME=BINARY... [tokio] [haproxy]

e.g. the binary of main against a change and the forwarder:

    git stash && cargo build --release -p sluice && cp target/release/sluice /tmp/sluice-main
    git stash pop && cargo build --release -p sluice -p sluice-testkit
    bench/versus.py main=/tmp/sluice-main change=target/release/sluice tokio

Each round runs sysbench oltp_point_select (prepared, as the suites send it) for S seconds
through each target (with --rows, oltp_read_only's simple ranges of R rows instead, as the
result-set cells of the TiDB suite run them); a target's figure is its process's utime + stime over the queries
sysbench counted. Every sluice runs as the TiDB suite runs it (bench/tidb.py): passthrough,
one worker, the server's status address read, least-latency balancing; HAProxy in TCP mode with
one thread. Prints each round and the median and mean per target. The tidb-server is
scripts/tidb.sh's (built once and cached); with --mariadb, a MariaDB server of sluice-mariadb's
instead (the benchmarks' options), and sluice without a status address.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from ports import free_ports, wait_port
from bench import SERVER_OPTIONS
from suites import RANGE_ARGS

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench/work/versus"
SYSBENCH = ["sysbench", "--mysql-host=127.0.0.1", "--mysql-user=sbtest", "--mysql-password=sbtest",
            "--mysql-db=sbtest", "--tables=2", "--table-size=50000"]


def start_tidb(procs):
    """A tidb-server with GOMAXPROCS=1 on a fresh store, the sbtest user and tables made: its
    SQL and status ports."""
    binary = subprocess.run([str(ROOT / "scripts/tidb.sh")], check=True, capture_output=True, text=True).stdout.strip()
    fresh_work()
    port, status = free_ports(2)
    cfg = WORK / "tidb.toml"
    cfg.write_text(f'host = "127.0.0.1"\nport = {port}\nstore = "unistore"\npath = "{WORK / "store"}"\nsocket = ""\n'
                   f'tmp-storage-path = "{WORK}"\n[status]\nstatus-host = "127.0.0.1"\nstatus-port = {status}\n'
                   f'report-status = true\n[performance]\nrun-auto-analyze = false\n[log]\nlevel = "error"\n'
                   f'slow-query-file = "{WORK / "slow.log"}"\n[log.file]\nfilename = "{WORK / "tidb.log"}"\n')
    p = subprocess.Popen([binary, f"--config={cfg}"], stdout=subprocess.DEVNULL, stderr=open(WORK / "tidb.err", "w"),
                         env=dict(os.environ, GOMAXPROCS="1"))
    procs.append(p)
    wait_port(port, p, timeout=120)
    root = ["mariadb", "-h127.0.0.1", f"-P{port}", "-uroot", "--skip-ssl", "-e"]
    for _ in range(600):
        if subprocess.run(root + ["SELECT 1"], capture_output=True).returncode == 0:
            break
        if p.poll() is not None:
            sys.exit(f"tidb-server exited; see {WORK / 'tidb.err'}")
        subprocess.run(["sleep", "0.2"])
    subprocess.run(root + ["CREATE USER IF NOT EXISTS 'sbtest'@'%' IDENTIFIED BY 'sbtest'; "
                           "GRANT ALL ON *.* TO 'sbtest'@'%'; CREATE DATABASE IF NOT EXISTS sbtest"], check=True)
    prepare(port)
    return port, status


def start_mariadb(procs):
    """A MariaDB server of sluice-mariadb's (the sbtest user made) with the benchmarks' options,
    on a fresh data folder, its tables made: its port, and no status port."""
    fresh_work()
    options = [a for o in SERVER_OPTIONS.split() for a in ("--server-option", o)]
    p = subprocess.Popen([str(ROOT / "target/release/sluice-mariadb"), "--count", "1", "--dir", str(WORK / "mariadb")] + options,
                         stdout=subprocess.PIPE, stderr=open(WORK / "mariadb.log", "w"), text=True)
    procs.append(p)
    addr = p.stdout.readline().strip()
    if not addr:
        sys.exit(f"sluice-mariadb failed; see {WORK / 'mariadb.log'}")
    port = int(addr.rsplit(":", 1)[1])
    prepare(port)
    return port, None


def fresh_work():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)


def prepare(port):
    """The sbtest tables, made through the server's port."""
    subprocess.run(SYSBENCH + ["oltp_point_select", f"--mysql-port={port}", "--threads=2", "prepare"], check=True, capture_output=True)


def start_haproxy(port, procs):
    """HAProxy in TCP mode, one thread, as the suites run it: the process and its port."""
    (listen,) = free_ports(1)
    cfg = WORK / "haproxy.cfg"
    cfg.write_text(f"global\n    maxconn 4000\n    nbthread 1\ndefaults\n    mode tcp\n    timeout connect 2s\n"
                   f"    timeout client 30000s\n    timeout server 30000s\nlisten mysql\n    bind 127.0.0.1:{listen}\n"
                   f"    server db1 127.0.0.1:{port}\n")
    p = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=open(WORK / "haproxy.log", "w"))
    procs.append(p)
    wait_port(listen, p)
    return p, listen


def start_target(name, binary, port, status, procs):
    """sluice (`binary`) as the TiDB suite runs it, the tokio forwarder or HAProxy: the process
    and its listening port."""
    if binary == "haproxy":
        return start_haproxy(port, procs)
    if binary == "tokio":
        p = subprocess.Popen([str(ROOT / "target/release/sluice-forward"), "tokio", f"127.0.0.1:{port}"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(p)
        listen = int(p.stdout.readline().strip().rsplit(":", 1)[1])
    else:
        (listen,) = free_ports(1)
        cfg = WORK / f"{name}.toml"
        cfg.write_text(f'tls = "off"\n[[listeners]]\naddress = "127.0.0.1:{listen}"\n[proxy]\nworkers = 1\n'
                       f'max_connections = 20000\nbalance = "least-latency"\n[[backends]]\naddress = "127.0.0.1:{port}"\n'
                       + (f'status = "127.0.0.1:{status}"\n' if status else ""))
        p = subprocess.Popen([binary, "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=open(WORK / f"{name}.log", "w"))
        procs.append(p)
    wait_port(listen, p)
    return p, listen


def cpu_ticks(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--duration", type=int, default=8, help="seconds per target per round")
    ap.add_argument("--threads", type=int, default=32, help="sysbench threads")
    ap.add_argument("--rows", type=int, help="oltp_read_only's simple ranges of this many rows, not point selects")
    ap.add_argument("--mariadb", action="store_true", help="in front of a MariaDB server, not a tidb-server")
    ap.add_argument("targets", nargs="+", help="NAME=BINARY of a sluice, tokio (the forwarder) or haproxy")
    args = ap.parse_args()
    tick = os.sysconf("SC_CLK_TCK")
    workload = ["oltp_point_select"]
    if args.rows:
        workload = ["oltp_read_only", f"--range_size={args.rows}"] + RANGE_ARGS
    procs = []
    try:
        port, status = start_mariadb(procs) if args.mariadb else start_tidb(procs)
        targets = {}
        for t in args.targets:
            name, _, binary = t.partition("=") if "=" in t else (t, "", t)
            targets[name] = start_target(name, binary, port, status, procs)
        names = list(targets)
        per_query = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                p, listen = targets[n]
                before = cpu_ticks(p.pid)
                out = subprocess.run(SYSBENCH + workload + [f"--mysql-port={listen}", f"--threads={args.threads}", f"--time={args.duration}", "run"],
                                     capture_output=True, text=True, check=True).stdout
                queries = int(re.search(r"queries:\s+(\d+)", out).group(1))
                per_query[n].append((cpu_ticks(p.pid) - before) / tick * 1e6 / queries)
                print(f"round {r} {n}: {per_query[n][-1]:.2f} µs of CPU per query, {queries / args.duration:.0f} QPS", flush=True)
        for n in names:
            v = per_query[n]
            print(f"{n}: median {statistics.median(v):.2f} µs, mean {statistics.mean(v):.2f} µs per query over {len(v)} rounds")
        # Over HAProxy's, round by round (the host's noise falls on a round's targets alike).
        if "haproxy" in per_query:
            for n in names:
                ratios = [a / b for a, b in zip(per_query[n], per_query["haproxy"])]
                print(f"{n} over haproxy: median {statistics.median(ratios):.3f}, mean {statistics.mean(ratios):.3f}")
    finally:
        for p in procs:
            p.terminate()


if __name__ == "__main__":
    main()
