#!/usr/bin/env python3
"""Moving sessions off a TiDB server under load, as TiProxy's report measures it: what clients
see when a TiDB address is drained, or a tidb-server is stopped with SIGTERM, through sluice
(passthrough: sluice never sees a password; sessions move by TiDB's session states), beside the
same load directly or through HAProxy.

    python3 bench/migration.py [--seconds 30] [--threads 8] [--name tidb-migration-2vcpu]

(with --name, the tables also go to bench/results/NAME/report.md)

- drain: two addresses of one tidb-server (its TCP port and its Unix socket) stand in for two
  servers sharing one store; sysbench oltp_read_write on small tables, once directly (TiDB's own
  write conflicts, the baseline) and once through sluice, which drains the TCP address a third of
  the way in (POST /backends/tcp/drain).
- sigterm: two tidb-servers sharing nothing but schema (point selects on identical tables), the
  second with a graceful wait of 8 s; sysbench oltp_point_select through sluice (the servers'
  status addresses read every 300 ms) and through HAProxy (its check reads the same /status every
  300 ms), each with the second server stopped with SIGTERM a third of the way in.

Figures: client errors (by MySQL error code) and reconnects as sysbench counts them (it ignores
errors and reconnects after a lost connection, through scripts/sysbench-reconnect-shim.c),
sessions moved (sluice's own counter), seconds from the drain or SIGTERM until no session is left
there, and the slowest second's queries against the median second's. Two addresses of one server
cannot show servers that differ (one being upgraded, its own caches): the sigterm case has two.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ports import free_ports, wait_port

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench/work/migration"
GRACEFUL_WAIT = 8


class TiDb:
    """A tidb-server (scripts/tidb.sh's build) on a fresh store, with the session-token signing
    certificate every server here shares and a graceful wait before shutdown."""

    def __init__(self, binary, name, graceful_wait):
        d = WORK / name
        d.mkdir(parents=True)
        self.port, self.status = free_ports(2)
        self.socket = d / "tidb.sock"
        cert, key = WORK / "token-cert.pem", WORK / "token-key.pem"
        cfg = d / "tidb.toml"
        cfg.write_text(f'host = "127.0.0.1"\nport = {self.port}\nstore = "unistore"\npath = "{d / "store"}"\n'
                       f'socket = "{self.socket}"\ntmp-storage-path = "{d}"\ngraceful-wait-before-shutdown = {graceful_wait}\n'
                       f'[status]\nstatus-host = "127.0.0.1"\nstatus-port = {self.status}\nreport-status = true\n'
                       f'[security]\nsession-token-signing-cert = "{cert}"\nsession-token-signing-key = "{key}"\n'
                       f'[performance]\nrun-auto-analyze = false\n[log]\nlevel = "error"\nslow-query-file = "{d / "slow.log"}"\n'
                       f'[log.file]\nfilename = "{d / "tidb.log"}"\n')
        self.proc = subprocess.Popen([binary, f"--config={cfg}"], stdout=subprocess.DEVNULL, stderr=open(d / "stderr.log", "w"),
                                     env=dict(os.environ, GOMAXPROCS="1"))
        wait_port(self.port, self.proc, timeout=120)
        for _ in range(600):
            if subprocess.run(self.sql_args("SELECT 1"), capture_output=True).returncode == 0:
                break
            if self.proc.poll() is not None:
                sys.exit(f"tidb-server exited; see {d / 'stderr.log'}")
            time.sleep(0.2)
        subprocess.run(self.sql_args("CREATE USER IF NOT EXISTS 'sbtest'@'%' IDENTIFIED BY 'sbtest'; "
                                     "GRANT ALL ON *.* TO 'sbtest'@'%'; CREATE DATABASE IF NOT EXISTS sbtest"), check=True)

    def sql_args(self, sql):
        return ["mariadb", "-h127.0.0.1", f"-P{self.port}", "-uroot", "--skip-ssl", "-e", sql]


def token_cert():
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=sluice-bench-token",
                    "-keyout", str(WORK / "token-key.pem"), "-out", str(WORK / "token-cert.pem")],
                   check=True, capture_output=True)


def shim():
    """The reconnect shim: sysbench goes on after a lost connection, counting a reconnect."""
    out = WORK / "reconnect-shim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(ROOT / "scripts/sysbench-reconnect-shim.c"), "-ldl"],
                   check=True)
    return out


def sysbench(workload, port, tables, threads=2, seconds=None, so=None):
    """sysbench `workload` against `port`: prepare (no `seconds`), or run it, errors ignored."""
    args = ["sysbench", workload, "--mysql-host=127.0.0.1", f"--mysql-port={port}", "--mysql-user=sbtest",
            "--mysql-password=sbtest", "--mysql-db=sbtest", f"--tables={tables}", "--table-size=1000", f"--threads={threads}"]
    if seconds is None:
        subprocess.run(args + ["prepare"], check=True, capture_output=True)
        return None
    args += [f"--time={seconds}", "--mysql-ignore-errors=all", "--verbosity=5", "--report-interval=1", "run"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, LD_PRELOAD=str(so)))


def outcome(run):
    """What a finished sysbench run saw: errors by code, reconnects, queries per second."""
    text = run.communicate()[0]
    codes = {}
    for code in re.findall(r"Ignoring error (\d+)", text):
        codes[code] = codes.get(code, 0) + 1
    reconnects = re.search(r"reconnects:\s+(\d+)", text)
    per_second = [float(q) for q in re.findall(r"\] thds: \d+ tps: [\d.]+ qps: ([\d.]+)", text)]
    return {"errors": codes, "reconnects": int(reconnects.group(1)) if reconnects else None,
            "qps": statistics.median(per_second) if per_second else 0, "worst": min(per_second[1:-1], default=0)}


def admin(port, method, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=b"{}" if method == "POST" else None,
                                 headers={"Content-Type": "application/json"} if method == "POST" else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def sessions_on(admin_port, name):
    return next(b["sessions"] for b in json.loads(admin(admin_port, "GET", "/backends")) if b["name"] == name)


def moved(admin_port):
    text = admin(admin_port, "GET", "/metrics")
    m = re.search(r'sluice_session_moves_total\{reason="drain",result="moved"\} (\d+)', text)
    return int(m.group(1)) if m else 0


def start_sluice(name, backends, procs, health=""):
    listen, admin_port = free_ports(2)
    cfg = WORK / f"{name}.toml"
    cfg.write_text(f'tls = "off"\n[[listeners]]\naddress = "127.0.0.1:{listen}"\n[admin]\nlisten = "127.0.0.1:{admin_port}"\n'
                   f'[proxy]\nworkers = 1\nbalance = "round-robin"\n{health}'
                   + "".join(f'[[backends]]\nname = "{n}"\naddress = "{a}"\n{extra}' for n, a, extra in backends))
    p = subprocess.Popen([str(ROOT / "target/release/sluice"), "--config", str(cfg)], stdout=subprocess.DEVNULL,
                         stderr=open(WORK / f"{name}.log", "w"))
    procs.append(p)
    wait_port(listen, p)
    return listen, admin_port


def leave_timed(event, admin_port, name):
    """`event()` (a drain, a SIGTERM), then the seconds until no session is left on `name`."""
    start = time.monotonic()
    event()
    while time.monotonic() - start < 120:
        if sessions_on(admin_port, name) == 0:
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def under_load(workload, port, tables, a, so, event):
    """sysbench `workload` against `port`, `event()` a third of the way in (it returns a
    figure); the run's outcome with the event's figure."""
    figures = {}
    run = sysbench(workload, port, tables, a.threads, a.seconds, so)
    timer = threading.Timer(a.seconds / 3, lambda: figures.update(left=event()))
    timer.start()
    result = outcome(run)
    timer.join()
    return {**result, **figures}


def drain_case(binary, a, so, procs):
    db = TiDb(binary, "drain", 0)
    procs.append(db.proc)
    sysbench("oltp_read_write", db.port, 4)
    rows = {"directly": under_load("oltp_read_write", db.port, 4, a, so, lambda: None)}
    listen, admin_port = start_sluice("drain", [("tcp", f"127.0.0.1:{db.port}", ""), ("sock", str(db.socket), "")], procs)
    drain = lambda: leave_timed(lambda: admin(admin_port, "POST", "/backends/tcp/drain"), admin_port, "tcp")  # noqa: E731
    rows["sluice, tcp drained"] = {**under_load("oltp_read_write", listen, 4, a, so, drain), "moved": moved(admin_port)}
    return rows


def start_haproxy(servers, procs):
    (listen,) = free_ports(1)
    cfg = WORK / "haproxy.cfg"
    cfg.write_text("global\n    maxconn 4000\n    nbthread 1\ndefaults\n    mode tcp\n    timeout connect 2s\n"
                   "    timeout client 300s\n    timeout server 300s\nlisten mysql\n"
                   f"    bind 127.0.0.1:{listen}\n    balance roundrobin\n    option httpchk GET /status\n"
                   + "".join(f"    server {n} 127.0.0.1:{db.port} check port {db.status} inter 300 fall 1 rise 2\n" for n, db in servers))
    p = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=open(WORK / "haproxy.log", "w"))
    procs.append(p)
    wait_port(listen, p)
    return listen


def sigterm_case(binary, a, so, procs):
    rows = {}
    for target in ["sluice", "HAProxy"]:
        dbs = [TiDb(binary, f"{target}-a", 0), TiDb(binary, f"{target}-b", GRACEFUL_WAIT)]
        procs.extend(db.proc for db in dbs)
        for db in dbs:
            sysbench("oltp_point_select", db.port, 1)
        if target == "sluice":
            backends = [(n, f"127.0.0.1:{db.port}", f'status = "127.0.0.1:{db.status}"\n') for n, db in zip("ab", dbs)]
            listen, admin_port = start_sluice("sigterm", backends, procs, health='[health]\ninterval = "300ms"\n')
        else:
            listen, admin_port = start_haproxy(list(zip("ab", dbs)), procs), None
        if admin_port is None:
            # (HAProxy says nothing of where its sessions are.)
            row = under_load("oltp_point_select", listen, 1, a, so, dbs[1].proc.terminate)
        else:
            stop = lambda: leave_timed(dbs[1].proc.terminate, admin_port, "b")  # noqa: E731
            row = {**under_load("oltp_point_select", listen, 1, a, so, stop), "moved": moved(admin_port)}
        rows[f"{target}, b stopped (SIGTERM)"] = row
        for db in dbs:
            db.proc.kill()
    return rows


def table(title, rows, a, out):
    out += [f"### {title} ({a.threads} threads, {a.seconds} s)", "",
            "| run | client errors | reconnects | sessions moved | seconds until none left | median QPS | slowest second's QPS |",
            "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        errors = sum(r["errors"].values())
        codes = ", ".join(f"{n}× {c}" for c, n in sorted(r["errors"].items()))
        left = "" if r.get("left") is None else f"{r['left']:.2f}"
        out.append(f"| {name} | {errors}{f' ({codes})' if codes else ''} | {r['reconnects']} | {r.get('moved', '')} | {left} "
                   f"| {r['qps']:.0f} | {r['worst']:.0f} |")
    out.append("")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=30,
                    help=f"each sysbench run's length (more than 1.5 times {GRACEFUL_WAIT} s: the stopped server's graceful "
                         "wait ends within the run)")
    ap.add_argument("--threads", type=int, default=8, help="sysbench threads")
    ap.add_argument("--name", help="also write the tables to bench/results/NAME/report.md")
    a = ap.parse_args()
    binary = subprocess.run([str(ROOT / "scripts/tidb.sh")], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice", "--bin", "sluice"], cwd=ROOT, check=True)
    subprocess.run(["rm", "-rf", str(WORK)], check=True)
    WORK.mkdir(parents=True)
    token_cert()
    so = shim()
    procs = []
    out = ["# Moving sessions off a TiDB server under load", "",
           f"Command: `python3 bench/migration.py --seconds {a.seconds} --threads {a.threads}`", "",
           "Machine: 2 cores; sysbench, the tidb-servers (GOMAXPROCS=1) and the proxy share them. What each run is: "
           "the docstring of bench/migration.py.", ""]
    try:
        table("Drain of one TiDB address under oltp_read_write", drain_case(binary, a, so, procs), a, out)
        table("SIGTERM to a tidb-server under oltp_point_select", sigterm_case(binary, a, so, procs), a, out)
        print("\n".join(out))
        if a.name:
            (ROOT / "bench/results" / a.name).mkdir(parents=True, exist_ok=True)
            (ROOT / "bench/results" / a.name / "report.md").write_text("\n".join(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


if __name__ == "__main__":
    main()
