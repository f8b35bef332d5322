"""The TiDB suite: the TiProxy performance report's tables in front of one tidb-server (TiDB with
its embedded store, built by scripts/tidb.sh, GOMAXPROCS=1), in one run: directly, through
HAProxy in TCP mode, through two byte forwarders that do no protocol work (sluice-forward: an epoll
loop, and tokio's current-thread runtime as each of sluice's workers runs it) and through sluice in passthrough mode with what it adds for TiDB switched on (the server's
status address read at every health check and its /metrics every 5 s, balancing by the server's
response time, CPU and memory, the statements followed that decide when a session may move), with
--pgo also through sluice's profile-guided build (scripts/pgo.sh) set up the same way. Every proxy
runs one thread, as in the seed (one worker or GOMAXPROCS=1 each).

The seed's workloads at this machine's scale: sysbench's basic workloads (point_select,
read_only, write_only, read_write) at --tidb-threads (the seed's 32 and 8 threads fit two cores
shared by sysbench, the server and the proxy), result sets of 10 to 10000 rows (oltp_read_only
with one simple range per transaction, at 8 threads), long connections (the basic workloads:
each sysbench thread keeps its connection) and short ones (a connection per query, opened and
closed as fast as --churn-rate allows: what one costs each process). TiProxy itself cannot be
built from the package registries here, so it is not among the targets; TiProxy's figures of
one earlier run here are quoted beside ours.
"""

import os
import subprocess
import time

from ports import free_ports, wait_port

TARGETS = ["tidb-direct", "tidb-haproxy", "tidb-forward", "tidb-forward-tokio", "tidb-sluice"]
# sluice's profile-guided build (scripts/pgo.sh), with --pgo.
PGO_TARGET = "tidb-sluice-pgo"


def targets(pgo):
    """The suite's targets, with the PGO build's when it is measured."""
    return TARGETS + ([PGO_TARGET] if pgo else [])

WORKLOADS = ["oltp_point_select", "oltp_read_only", "oltp_write_only", "oltp_read_write"]
RANGE_THREADS = 8
LABELS = {"tidb-direct": "direct", "tidb-haproxy": "HAProxy", "tidb-forward": "forwarder",
          "tidb-forward-tokio": "tokio forwarder", "tidb-sluice": "sluice", PGO_TARGET: "sluice, PGO build"}
# What was measured here once before this suite (issue 40: sysbench, one tidb-server, each proxy
# one worker, in one run): CPU per query and QPS of sluice, TiProxy and a byte forwarder, each
# over HAProxy's.
SEED = {"oltp_point_select/32": {"cpu": {"tidb-sluice": 1.04, "tiproxy": 1.62, "tidb-forward": 0.92},
                                 "qps": {"tidb-sluice": 0.98, "tiproxy": 0.94}},
        "oltp_read_only/8": {"cpu": {"tidb-sluice": 1.08, "tiproxy": 1.89, "tidb-forward": 0.89},
                             "qps": {"tidb-sluice": 0.97, "tiproxy": 0.81}}}


def root_sql(port, sql):
    return subprocess.run(["mariadb", "-h127.0.0.1", f"-P{port}", "-uroot", "--skip-ssl", "-N", "-e", sql],
                          check=True, capture_output=True, text=True, timeout=120).stdout.strip()


def start(env, args, prepare, target_class):
    """Starts the tidb-server (built or taken from the cache by scripts/tidb.sh), makes the sbtest
    user and tables (`prepare(env, port)`), and starts the targets in front of it."""
    binary = subprocess.run([str(env.root / "scripts/tidb.sh")], check=True, capture_output=True, text=True).stdout.strip()
    d = env.work / "tidb"
    d.mkdir(parents=True, exist_ok=True)
    port, status = free_ports(2)
    cfg = d / "tidb.toml"
    cfg.write_text(f"""host = "127.0.0.1"
port = {port}
store = "unistore"
path = "{d / 'store'}"
socket = ""
tmp-storage-path = "{d}"
[status]
status-host = "127.0.0.1"
status-port = {status}
report-status = true
[performance]
run-auto-analyze = false
[log]
level = "error"
slow-query-file = "{d / 'slow.log'}"
[log.file]
filename = "{d / 'tidb.log'}"
""")
    p = subprocess.Popen([binary, f"--config={cfg}"], stdout=subprocess.DEVNULL, stderr=open(env.work / "tidb-server.log", "w"),
                         env=dict(os.environ, GOMAXPROCS="1"))
    env.procs.append(p)
    wait_port(port, p, timeout=120)
    deadline = time.time() + 120
    while True:
        try:
            root_sql(port, "SELECT 1")
            break
        except subprocess.CalledProcessError:
            if time.time() > deadline or p.poll() is not None:
                raise RuntimeError("tidb-server did not come up; see bench/work/tidb-server.log")
            time.sleep(0.2)
    root_sql(port, "CREATE USER IF NOT EXISTS 'sbtest'@'%' IDENTIFIED BY 'sbtest'; GRANT ALL ON *.* TO 'sbtest'@'%'; "
                   "CREATE DATABASE IF NOT EXISTS sbtest")
    prepare(env, port)
    env.targets["tidb-direct"] = target_class("tidb-direct", port)
    env.start_haproxy("tidb-haproxy", port, threads=1)
    env.start_forward("tidb-forward", "epoll", port)
    env.start_forward("tidb-forward-tokio", "tokio", port)
    start_sluice(env, port, status, target_class, "tidb-sluice", env.root / "target/release/sluice")
    if env.args.pgo:
        start_sluice(env, port, status, target_class, PGO_TARGET, env.root / "target/pgo/release/sluice")
    for name in targets(env.args.pgo):
        if name in env.targets:
            env.targets[name].server_pid = p.pid


def start_sluice(env, port, status, target_class, name, binary):
    """sluice (`binary`) in passthrough mode, one worker, with what TiDB backends add switched on:
    the server's status address read at every health check and its /metrics every 5 s, balancing
    by its response time, CPU and memory."""
    listen, admin = free_ports(2)
    cfg = env.work / f"{name}.toml"
    cfg.write_text(f"""tls = "off"
[[listeners]]
address = "127.0.0.1:{listen}"
[admin]
listen = "127.0.0.1:{admin}"
[proxy]
workers = 1
max_connections = 20000
balance = "least-latency"
[[backends]]
address = "127.0.0.1:{port}"
status = "127.0.0.1:{status}"
""")
    p = env.spawn([str(binary), "--config", str(cfg)], f"{name}.log")
    wait_port(listen, p)
    env.targets[name] = target_class(name, listen, proc=p)


def cells(args, cell_class, range_args):
    out = []
    measured = targets(args.pgo)
    for w in WORKLOADS:
        for threads in args.tidb_threads:
            out.append(cell_class("tidb", f"basic/{w}/{threads}", w, threads, measured))
    for size in args.range_sizes:
        out.append(cell_class("tidb", f"ranges/{size}", "oltp_read_only", RANGE_THREADS, measured,
                              range_args + [f"--range_size={size}"]))
    # Short connections: what one costs each process (no workload).
    out.append(cell_class("tidb", "short/cost", None, 0, measured, churn=args.churn_rate))
    return out


def report(med, args, lines, f, get):
    def k(variant, target):
        return f"tidb/{variant}/{target}"

    def vs(variant, target, field):
        a, b = get(med, k(variant, target), field), get(med, k(variant, "tidb-haproxy"), field)
        return None if a is None or not b else a / b

    pgo = any(key.endswith("/" + PGO_TARGET) for key in med)
    pgo_head, pgo_rule = (" sluice PGO CPU vs HAProxy |", "---|") if pgo else ("", "")
    lines += ["One tidb-server (unistore, GOMAXPROCS=1) on this machine; every proxy one thread; sysbench, the "
              "server and the proxy share the two cores. Ratios are over HAProxy's in the same run: CPU is the "
              "proxy process's utime+stime per query.", "",
              "### Long connections: the basic workloads", "",
              "| workload | threads | direct QPS | HAProxy QPS | sluice QPS vs HAProxy | forwarder QPS vs HAProxy "
              "| HAProxy µs/query | sluice µs/query | sluice CPU vs HAProxy | forwarder CPU vs HAProxy "
              "| tokio forwarder CPU vs HAProxy |" + pgo_head,
              "|---|---|---|---|---|---|---|---|---|---|---|" + pgo_rule]
    for w in WORKLOADS:
        for threads in args.tidb_threads:
            v = f"basic/{w}/{threads}"
            row = [w, str(threads), f(get(med, k(v, "tidb-direct"), "qps")), f(get(med, k(v, "tidb-haproxy"), "qps")),
                   f(vs(v, "tidb-sluice", "qps"), 2), f(vs(v, "tidb-forward", "qps"), 2),
                   f(get(med, k(v, "tidb-haproxy"), "proxy_cpu_us_per_query"), 1),
                   f(get(med, k(v, "tidb-sluice"), "proxy_cpu_us_per_query"), 1),
                   f(vs(v, "tidb-sluice", "proxy_cpu_us_per_query"), 2), f(vs(v, "tidb-forward", "proxy_cpu_us_per_query"), 2),
                   f(vs(v, "tidb-forward-tokio", "proxy_cpu_us_per_query"), 2)]
            if pgo:
                row.append(f(vs(v, PGO_TARGET, "proxy_cpu_us_per_query"), 2))
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "The cells measured once before this suite existed (sluice, TiProxy and a byte forwarder against "
              "HAProxy in one run, one tidb-server, each proxy one worker; TiProxy cannot be built from the package "
              "registries here, so only that run has it) beside this run's nearest cell:", "",
              "| cell | CPU vs HAProxy: sluice (before) | sluice (now) | TiProxy (before) | forwarder (before) | forwarder (now) "
              "| QPS vs HAProxy: sluice (before) | sluice (now) | TiProxy (before) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for cell, seed in SEED.items():
        w, seed_threads = cell.split("/")
        threads = min(args.tidb_threads, key=lambda t: abs(t - int(seed_threads)))
        v = f"basic/{w}/{threads}"
        row = [f"{w} at {seed_threads} threads (here {threads})", f(seed["cpu"]["tidb-sluice"], 2),
               f(vs(v, "tidb-sluice", "proxy_cpu_us_per_query"), 2), f(seed["cpu"]["tiproxy"], 2),
               f(seed["cpu"]["tidb-forward"], 2), f(vs(v, "tidb-forward", "proxy_cpu_us_per_query"), 2),
               f(seed["qps"]["tidb-sluice"], 2), f(vs(v, "tidb-sluice", "qps"), 2), f(seed["qps"]["tiproxy"], 2)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"### Result-set size (oltp_read_only, one simple range per transaction, {RANGE_THREADS} threads)", "",
              "| rows | direct QPS | HAProxy QPS | sluice QPS vs HAProxy | HAProxy µs/query | sluice µs/query "
              "| sluice CPU vs HAProxy | forwarder CPU vs HAProxy |",
              "|---|---|---|---|---|---|---|---|"]
    for size in args.range_sizes:
        v = f"ranges/{size}"
        row = [str(size), f(get(med, k(v, "tidb-direct"), "qps")), f(get(med, k(v, "tidb-haproxy"), "qps")),
               f(vs(v, "tidb-sluice", "qps"), 2), f(get(med, k(v, "tidb-haproxy"), "proxy_cpu_us_per_query"), 1),
               f(get(med, k(v, "tidb-sluice"), "proxy_cpu_us_per_query"), 1),
               f(vs(v, "tidb-sluice", "proxy_cpu_us_per_query"), 2), f(vs(v, "tidb-forward", "proxy_cpu_us_per_query"), 2)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"### Short connections (a connection per query, up to {args.churn_rate} per second)", "",
              "| target | connections | proxy µs/connection | tidb-server µs/connection |", "|---|---|---|---|"]
    for t in targets(pgo):
        c = k("short/cost", t)
        lines.append(f"| {LABELS[t]} | {f(get(med, c, 'conns'))} | {f(get(med, c, 'proxy_us_per_conn'), 1)} "
                     f"| {f(get(med, c, 'server_us_per_conn'), 1)} |")
    lines.append("")
