#!/usr/bin/env python3
"""sluice benchmark harness.

Runs sysbench against several targets in one interleaved run (direct MariaDB, HAProxy in TCP
mode, sluice in one or more configurations), samples each proxy's CPU time and memory from
/proc, and writes raw JSON plus a Markdown report. Every cell is the median of --rounds rounds.

    python3 bench/bench.py --suites basic --threads 8,32 --duration 20 --rounds 3
    python3 bench/bench.py --suites basic --targets sluice,sluice-multi   # runtime flavours

It provisions what it needs: apt packages (sysbench, haproxy, mariadb-server) through
scripts/setup.sh, a local MariaDB through the sluice-mariadb helper, the sbtest tables, and a
release build of sluice.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def proc_cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Target:
    """Something sysbench connects to; `pid` is the proxy process (None for direct)."""

    def __init__(self, name, port, pid=None, socket_path=None, proc=None):
        self.name, self.port, self.pid, self.socket_path, self.proc = name, port, pid, socket_path, proc

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_backend():
    exe = ROOT / "target/release/sluice-mariadb"
    out = open(WORK / "backend.addr", "w")
    proc = subprocess.Popen([str(exe), "--count", "1", "--dir", str(WORK / "mariadb")], stdout=out)
    deadline = time.time() + 300
    while time.time() < deadline:
        text = (WORK / "backend.addr").read_text().strip()
        if text:
            host, port = text.splitlines()[0].rsplit(":", 1)
            return proc, int(port)
        if proc.poll() is not None:
            raise RuntimeError("sluice-mariadb failed")
        time.sleep(0.1)
    raise RuntimeError("backend did not start")


def start_haproxy(backend_port, threads):
    port = free_port()
    cfg = WORK / "haproxy.cfg"
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    maxconn = max(1000, min(soft, hard) // 2 - 100)
    cfg.write_text(
        f"""global
    maxconn {maxconn}
    nbthread {threads}
defaults
    mode tcp
    timeout connect 2s
    timeout client 30000s
    timeout server 30000s
listen mysql
    bind 127.0.0.1:{port}
    balance leastconn
    server db1 127.0.0.1:{backend_port} check inter 2000 rise 2 fall 3
"""
    )
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=open(WORK / "haproxy.log", "w"))
    wait_port(port)
    return Target("haproxy", port, proc.pid, proc=proc)


def start_sluice(name, backend_port, workers, runtime="per-core"):
    port = free_port()
    sock = WORK / f"{name}.sock"
    args = [
        str(ROOT / "target/release/sluice"),
        "--listen", f"127.0.0.1:{port}",
        "--listen", str(sock),
        "--backend", f"127.0.0.1:{backend_port}",
        "--workers", str(workers),
        "--runtime", runtime,
    ]
    env = dict(os.environ, RUST_LOG="warn")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(WORK / f"{name}.log", "w"), env=env)
    wait_port(port)
    return Target(name, port, proc.pid, socket_path=str(sock), proc=proc)


SYSBENCH_COMMON = ["--db-driver=mysql", "--mysql-user=sbtest", "--mysql-password=sbtest", "--mysql-db=sbtest"]


def sysbench(target, workload, threads, duration, table_size, tables, extra=(), unix=False):
    conn = [f"--mysql-socket={target.socket_path}"] if unix else ["--mysql-host=127.0.0.1", f"--mysql-port={target.port}"]
    cmd = ["sysbench", workload, *SYSBENCH_COMMON, *conn, f"--tables={tables}", f"--table-size={table_size}",
           f"--threads={threads}", f"--time={duration}", "--percentile=95", "--report-interval=0", *extra, "run"]
    cpu0 = proc_cpu_seconds(target.pid) if target.pid else None
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    cpu1 = proc_cpu_seconds(target.pid) if target.pid else None
    if out.returncode != 0:
        raise RuntimeError(f"sysbench failed on {target.name}: {out.stderr or out.stdout}")
    text = out.stdout
    queries = int(re.search(r"queries:\s+(\d+)", text).group(1))
    qps = float(re.search(r"queries:\s+\d+\s+\(([\d.]+) per sec", text).group(1))
    avg = float(re.search(r"avg:\s+([\d.]+)", text).group(1))
    p95 = float(re.search(r"95th percentile:\s+([\d.]+)", text).group(1))
    errors = int(re.search(r"ignored errors:\s+(\d+)", text).group(1))
    cell = {"qps": qps, "avg_ms": avg, "p95_ms": p95, "queries": queries, "errors": errors, "wall_s": wall}
    if cpu0 is not None:
        cpu = cpu1 - cpu0
        cell["proxy_cpu_pct"] = 100.0 * cpu / wall
        cell["proxy_cpu_us_per_query"] = 1e6 * cpu / max(queries, 1)
        cell["proxy_rss_kb"] = proc_rss_kb(target.pid)
    return cell


def prepare(backend_port, table_size, tables):
    log(f"preparing sbtest: {tables} table(s) of {table_size} rows")
    t = Target("direct", backend_port)
    subprocess.run(["sysbench", "oltp_common", *SYSBENCH_COMMON, "--mysql-host=127.0.0.1", f"--mysql-port={t.port}",
                    f"--tables={tables}", f"--table-size={table_size}", "cleanup"], capture_output=True)
    subprocess.run(["sysbench", "oltp_common", *SYSBENCH_COMMON, "--mysql-host=127.0.0.1", f"--mysql-port={t.port}",
                    f"--tables={tables}", f"--table-size={table_size}", "prepare"], check=True, capture_output=True)


BASIC = ["oltp_point_select", "oltp_read_only", "oltp_write_only", "oltp_read_write"]


def run_basic(targets, args, results):
    for rnd in range(args.rounds):
        for threads in args.threads:
            for workload in args.workloads:
                for t in targets:
                    cell = sysbench(t, workload, threads, args.duration, args.table_size, args.tables)
                    key = f"basic/{workload}/{threads}/{t.name}"
                    results.setdefault(key, []).append(cell)
                    log(f"round {rnd + 1} {key}: {cell['qps']:.0f} qps"
                        + (f", {cell['proxy_cpu_us_per_query']:.1f} us/query" if "proxy_cpu_us_per_query" in cell else ""))


def median_cells(results):
    out = {}
    for key, cells in results.items():
        med = {}
        for field in cells[0]:
            med[field] = statistics.median(c[field] for c in cells)
        med["rounds"] = len(cells)
        out[key] = med
    return out


def report(med, args, path):
    lines = [f"# sluice benchmark: {args.name}", "",
             f"Command: `{' '.join(sys.argv)}`", "",
             f"Machine: {os.cpu_count()} cores; every cell is the median of {args.rounds} round(s) of {args.duration} s.", ""]
    names = [t for t in args.targets]
    for threads in args.threads:
        lines += [f"## Basic workloads, {threads} threads", "",
                  "| workload | " + " | ".join(f"{n} QPS" for n in names) + " | "
                  + " | ".join(f"{n} CPU µs/query" for n in names if n != "direct") + " |",
                  "|---|" + "---|" * (len(names) + len([n for n in names if n != "direct"]))]
        for w in args.workloads:
            row = [w]
            for n in names:
                c = med.get(f"basic/{w}/{threads}/{n}")
                row.append(f"{c['qps']:.0f}" if c else "-")
            for n in names:
                if n == "direct":
                    continue
                c = med.get(f"basic/{w}/{threads}/{n}")
                row.append(f"{c['proxy_cpu_us_per_query']:.1f}" if c else "-")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default=time.strftime("%Y%m%d-%H%M%S"))
    p.add_argument("--duration", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="8,32")
    p.add_argument("--table-size", type=int, default=100000)
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="proxy worker threads (sluice and HAProxy)")
    p.add_argument("--suites", default="basic")
    p.add_argument("--workloads", default=",".join(BASIC), help="basic-suite workloads to run")
    p.add_argument("--targets", default="direct,haproxy,sluice",
                   help="direct, haproxy, sluice (per-core runtime), sluice-multi (multi-thread runtime)")
    args = p.parse_args()
    args.threads = [int(x) for x in args.threads.split(",")]
    args.targets = args.targets.split(",")
    args.workloads = args.workloads.split(",")

    subprocess.run([str(ROOT / "scripts/setup.sh"), "sysbench", "haproxy"], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice", "-p", "sluice-testkit"], cwd=ROOT, check=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    backend, backend_port = start_backend()
    targets = []
    try:
        prepare(backend_port, args.table_size, args.tables)
        for name in args.targets:
            if name == "direct":
                targets.append(Target("direct", backend_port))
            elif name == "haproxy":
                targets.append(start_haproxy(backend_port, args.workers))
            elif name == "sluice":
                targets.append(start_sluice("sluice", backend_port, args.workers, "per-core"))
            elif name == "sluice-multi":
                targets.append(start_sluice("sluice-multi", backend_port, args.workers, "multi"))
            else:
                raise SystemExit(f"unknown target {name}")
        results = {}
        if "basic" in args.suites.split(","):
            run_basic(targets, args, results)
        med = median_cells(results)
        out = ROOT / "bench" / "results" / args.name
        out.mkdir(parents=True, exist_ok=True)
        (out / "raw.json").write_text(json.dumps({"args": vars(args), "rounds": results, "median": med}, indent=1))
        report(med, args, out / "report.md")
        log(f"report: {out / 'report.md'}")
        print((out / "report.md").read_text())
    finally:
        for t in targets:
            t.stop()
        backend.terminate()
        backend.wait()


if __name__ == "__main__":
    main()
