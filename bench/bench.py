#!/usr/bin/env python3
"""sluice benchmark harness.

Runs sysbench against direct MariaDB, HAProxy in TCP mode and sluice in one interleaved run,
samples each proxy's CPU time and memory from /proc, and writes raw JSON, a Markdown report and
PNG charts to bench/results/<name>/. Every cell is the median of --rounds rounds.

    python3 bench/bench.py                      # everything, default sizes (make bench)
    python3 bench/bench.py --smoke              # every suite at minimal size (make bench-smoke)
    python3 bench/bench.py --suites basic --threads 8,32 --duration 20 --rounds 3

It provisions what it needs: apt packages (sysbench, haproxy, mariadb-server) through
scripts/setup.sh, a local MariaDB through the sluice-mariadb helper (with a buffer pool that
holds the sbtest tables and a redo log that does not stall writes on checkpoints:
--server-options), the sbtest tables, a release build of sluice, and matplotlib for the charts.
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402
from ports import free_port, free_ports, wait_port  # noqa: E402
import suites  # noqa: E402
import tidb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work"
# The benchmarks' MariaDB server's options beyond the tests' (--server-options).
SERVER_OPTIONS = "--innodb-buffer-pool-size=1G --innodb-log-file-size=512M"
# sluice's profile-guided build (scripts/pgo.sh), measured beside the plain one with --pgo.
PGO_SLUICE = ROOT / "target/pgo/release/sluice"
CLK_TCK = os.sysconf("SC_CLK_TCK")
ALL_SUITES = ["basic", "ranges", "latency", "long", "short", "scaling", "floor", "multiplex", "idle", "drain", "split", "features",
              "capture", "failover", "tidb"]
# Not part of the default run: the comparison of sluice's two runtime flavours.
EXTRA_SUITES = ["runtime"]


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def proc_cpu_split(pid):
    """(utime, stime) of a process (all its threads), in seconds: user space and kernel."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def machine_cpu():
    """(busy, steal, total) jiffies of all cores together, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return user + nice + system + irq + softirq, steal, sum(v)


def proc_cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    return sum(proc_cpu_split(pid))


def child_pid(parent):
    """The first child process of `parent` (the MariaDB server sluice-mariadb started), or None."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    return int(d.name)
            except (OSError, ValueError, IndexError):
                pass
    return None


def proc_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Target:
    """Something sysbench connects to; `pid` is the proxy process (None for direct)."""

    def __init__(self, name, port, socket_path=None, proc=None):
        self.name, self.port, self.socket_path, self.proc = name, port, socket_path, proc
        self.pid = proc.pid if proc else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Env:
    """The running backends and targets of one benchmark run."""

    def __init__(self, args):
        self.args = args
        self.targets = {}
        self.extra_basic = []
        self.procs = []
        self.conns_bin = ROOT / "target/release/sluice-conns"
        self.root, self.work = ROOT, WORK

    def spawn(self, argv, log_name, stdout=subprocess.DEVNULL):
        p = subprocess.Popen(argv, stdout=stdout, stderr=open(WORK / log_name, "w"), text=True,
                             env=dict(os.environ, RUST_LOG="warn"))
        self.procs.append(p)
        return p

    def start_backend(self):
        options = [a for o in self.args.server_options.split() for a in ("--server-option", o)]
        p = self.spawn([str(ROOT / "target/release/sluice-mariadb"), "--count", "1", "--dir", str(WORK / "mariadb")] + options,
                       "mariadb.log", stdout=subprocess.PIPE)
        addr = p.stdout.readline().strip()
        if not addr:
            raise RuntimeError("sluice-mariadb failed; see bench/work/mariadb.log")
        self.backend_port = int(addr.rsplit(":", 1)[1])
        sock = next((WORK / "mariadb").glob("db-*/mariadb.sock"))
        self.targets["direct"] = Target("direct", self.backend_port, socket_path=str(sock))
        self.server_pid = child_pid(p.pid)

    def start_responder(self):
        p = self.spawn([str(ROOT / "target/release/sluice-responder")], "responder.log", stdout=subprocess.PIPE)
        self.responder_port = int(p.stdout.readline().strip().rsplit(":", 1)[1])

    def start_topology(self):
        """A primary and two GTID replicas (sluice-mariadb --replicas 2), the sbtest tables made on
        the primary and replicated: the split suite's servers."""
        p = self.spawn([str(ROOT / "target/release/sluice-mariadb"), "--replicas", "2", "--dir", str(WORK / "repl")],
                       "repl.log", stdout=subprocess.PIPE)
        ports = [int(p.stdout.readline().strip().rsplit(":", 1)[1]) for _ in range(3)]
        socks = sockets_by_port(WORK / "repl")
        self.repl_ports, self.repl_socks = ports, [socks[port] for port in ports]
        for sock in self.repl_socks:
            root_sql(sock, "SET GLOBAL max_prepared_stmt_count = 1048576")
        prepare_tables(self, ports[0], self.repl_socks[0], log_as="the primary of the split suite")
        pos = root_sql(self.repl_socks[0], "SELECT @@gtid_binlog_pos")
        for sock in self.repl_socks[1:]:
            if root_sql(sock, f"SELECT MASTER_GTID_WAIT('{pos}', 600)") != "0":
                raise RuntimeError(f"a replica did not catch up with the primary ({sock})")
        # The seed's baseline: one replica, directly.
        self.targets["split-direct"] = Target("split-direct", ports[1], socket_path=self.repl_socks[1])

    def start_haproxy(self, name, backend_port, more_ports=(), threads=None):
        port = free_port()
        sock = WORK / f"{name}.sock"
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cfg = WORK / f"{name}.cfg"
        cfg.write_text(f"""global
    maxconn {max(1000, min(soft, hard) // 2 - 100)}
    nbthread {threads or self.args.workers}
defaults
    mode tcp
    timeout connect 2s
    timeout client 30000s
    timeout server 30000s
listen mysql
    bind 127.0.0.1:{port}
    bind unix@{sock}
    balance leastconn
    server db1 127.0.0.1:{backend_port} check inter 2000 rise 2 fall 3
""" + "".join(f"    server db{i + 2} 127.0.0.1:{port} check inter 2000 rise 2 fall 3\n" for i, port in enumerate(more_ports)))
        p = self.spawn(["haproxy", "-db", "-f", str(cfg)], f"{name}.log")
        wait_port(port, p)
        self.targets[name] = Target(name, port, socket_path=str(sock), proc=p)

    def start_forward(self, name, mode, backend_port):
        """A byte forwarder with no protocol work (sluice-forward), for the floor suite."""
        p = self.spawn([str(ROOT / "target/release/sluice-forward"), mode, f"127.0.0.1:{backend_port}"],
                       f"{name}.log", stdout=subprocess.PIPE)
        addr = p.stdout.readline().strip()
        if not addr and mode == "uring":
            # io_uring may be disabled (kernel.io_uring_disabled) or blocked (container seccomp).
            log(f"sluice-forward uring did not start ({(WORK / f'{name}.log').read_text().strip()}); "
                "the floor suite runs without it")
            return
        if not addr:
            raise RuntimeError(f"sluice-forward {mode} failed; see bench/work/{name}.log")
        self.targets[name] = Target(name, int(addr.rsplit(":", 1)[1]), proc=p)

    def start_sluice(self, name, backend_port, workers, runtime="per-core", binary=None):
        """sluice in passthrough mode (`binary`: another build of it, e.g. PGO_SLUICE)."""
        port = free_port()
        sock = WORK / f"{name}.sock"
        p = self.spawn([str(binary or ROOT / "target/release/sluice"), "--listen", f"127.0.0.1:{port}", "--listen", str(sock),
                        "--backend", f"127.0.0.1:{backend_port}", "--workers", str(workers), "--runtime", runtime],
                       f"{name}.log")
        wait_port(port, p)
        self.targets[name] = Target(name, port, socket_path=str(sock), proc=p)

    def start_sluice_mux(self, name, backend_port, workers, cap, tls=True):
        """sluice in users mode, multiplexing sessions over at most `cap` backend connections
        (with TLS offered to clients, as by default, or not)."""
        self.start_sluice_users(name, workers, ("" if tls else 'tls = "off"\n'),
                                f"multiplex = true\nmax_backend_connections = {cap}\n",
                                f'[[backends]]\naddress = "127.0.0.1:{backend_port}"\n')

    def start_sluice_users(self, name, workers, root, proxy, backends):
        """sluice in users mode (user sbtest) with the given configuration pieces."""
        port, admin = free_ports(2)
        sock = WORK / f"{name}.sock"
        cfg = WORK / f"{name}.toml"
        cfg.write_text(root + f"""[[listeners]]
address = "127.0.0.1:{port}"
[[listeners]]
address = "{sock}"
[admin]
listen = "127.0.0.1:{admin}"
[proxy]
workers = {workers}
max_connections = 20000
{proxy}{backends}[[users]]
name = "sbtest"
password = "sbtest"
[capture]
allow_absolute_paths = true
""")
        p = self.spawn([str(ROOT / "target/release/sluice"), "--config", str(cfg)], f"{name}.log")
        wait_port(port, p)
        self.targets[name] = Target(name, port, socket_path=str(sock), proc=p)
        self.targets[name].admin_port = admin

    def start_sluice_two_addresses(self, name, backend_port, workers, multiplex):
        """users mode in front of the one server reached by two addresses, "tcp" and "sock"."""
        backends = (f'[[backends]]\naddress = "127.0.0.1:{backend_port}"\nname = "tcp"\n'
                    f'[[backends]]\naddress = "{self.targets["direct"].socket_path}"\nname = "sock"\n')
        self.start_sluice_users(name, workers, 'tls = "off"\n', f"multiplex = {'true' if multiplex else 'false'}\n", backends)

    def start_sluice_split(self, name, workers):
        """sluice in users mode with the read/write split over the topology (the monitor user
        tells the primary from the replicas)."""
        backends = "".join(f'[[backends]]\naddress = "127.0.0.1:{port}"\nname = "s{i}"\n' for i, port in enumerate(self.repl_ports))
        self.start_sluice_users(name, workers, "", "", '[health]\nuser = "monitor"\npassword = "monitorpw"\n'
                                '[routing]\nsplit = true\n' + backends)

    def start_features(self, workers):
        """The features suite: sluice in users mode with digests and rules off (feat-bare), with digests
        (feat-digests), with 100 regex rules that match none of sysbench's statements (feat-rules100),
        multiplexing (feat-mux), and with the read/write split over the one server as its primary
        (feat-split: every statement classified, then run where multiplexing would run it)."""
        backend = f'[[backends]]\naddress = "127.0.0.1:{self.backend_port}"\nrole = "primary"\n'
        off = '[digests]\nenabled = false\n'
        rules = "".join(f'[[rules]]\nname = "r{i}"\nmatch = "^select nothing_{i} from"\nblock = "no"\n' for i in range(100))
        plain = 'tls = "off"\n'
        self.start_sluice_users("feat-bare", workers, plain, "", backend + off)
        self.start_sluice_users("feat-digests", workers, plain, "", backend + '[digests]\nenabled = true\n')
        self.start_sluice_users("feat-rules100", workers, plain, "", backend + off + rules)
        self.start_sluice_users("feat-mux", workers, plain, "multiplex = true\n", backend + off)
        self.start_sluice_users("feat-split", workers, plain, "", backend + off + '[routing]\nsplit = true\n')

    def backend_threads(self):
        """Threads_connected of the MariaDB server (this query's own connection not counted)."""
        out = subprocess.run(["mariadb", f"--socket={self.targets['direct'].socket_path}", "-uroot", "-N", "-e",
                              "SHOW GLOBAL STATUS LIKE 'Threads_connected'"], capture_output=True, text=True)
        m = re.search(r"(\d+)\s*$", out.stdout)
        return int(m.group(1)) - 1 if m else None

    def cpu_seconds(self, pid):
        return proc_cpu_seconds(pid)

    def machine_cpu(self):
        return machine_cpu()

    def rss(self, t):
        return proc_rss_kb(t.pid) if t.pid else 0

    def sysbench_cmd(self, t, workload, threads, duration, extra=(), unix=False):
        a = self.args
        conn = [f"--mysql-socket={t.socket_path}"] if unix else ["--mysql-host=127.0.0.1", f"--mysql-port={t.port}"]
        return ["sysbench", workload, "--db-driver=mysql", "--mysql-user=sbtest", "--mysql-password=sbtest",
                "--mysql-db=sbtest", *conn, f"--tables={a.tables}", f"--table-size={a.table_size}",
                f"--threads={threads}", f"--time={duration}", "--percentile=95", "--report-interval=0",
                "--mysql-ignore-errors=all", *extra, "run"]

    def sysbench(self, t, workload, threads, duration, extra=(), unix=False):
        cmd = self.sysbench_cmd(t, workload, threads, duration, extra, unix)
        cpu0 = proc_cpu_split(t.pid) if t.pid else None
        srv0 = self.server_cpu(t)
        m0, ru0 = machine_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t0
        m1, ru1 = machine_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu1 = proc_cpu_split(t.pid) if t.pid else None
        srv1 = self.server_cpu(t)
        text = out.stdout
        m = re.search(r"queries:\s+(\d+)\s+\(([\d.]+) per sec", text)
        if out.returncode != 0 or not m:
            raise RuntimeError(f"sysbench {workload} failed on {t.name}: {out.stderr or text}")
        queries = int(m.group(1))
        # One-second samples, when asked for (--report-interval=1): the lowest.
        samples = [float(q) for q in re.findall(r"^\[ *\d+s \] thds: \d+ tps: [\d.]+ qps: ([\d.]+)", text, re.M)]
        cell = {
            "qps": float(m.group(2)),
            "avg_ms": float(re.search(r"avg:\s+([\d.]+)", text).group(1)),
            "p95_ms": float(re.search(r"95th percentile:\s+([\d.]+)", text).group(1)),
            "queries": queries,
            "errors": int(re.search(r"ignored errors:\s+(\d+)", text).group(1)),
            **({"min_qps": min(samples), "samples": len(samples)} if samples else {}),
            # The whole machine, in % of one core (all cores busy: 100 x cores), and sysbench.
            "machine_busy_pct": 100.0 * os.cpu_count() * (m1[0] - m0[0]) / max(m1[2] - m0[2], 1),
            "machine_steal_pct": 100.0 * os.cpu_count() * (m1[1] - m0[1]) / max(m1[2] - m0[2], 1),
            "client_cpu_pct": 100.0 * (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / wall,
        }
        if srv0 is not None and srv1 is not None:
            # The main MariaDB server's CPU (its clients' queries and everything else it does).
            cell["server_cpu_us_per_query"] = 1e6 * (srv1 - srv0) / max(queries, 1)
        if cpu0 is not None:
            user, kernel = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            cpu = user + kernel
            cell["proxy_cpu_pct"] = 100.0 * cpu / wall
            cell["proxy_cpu_us_per_query"] = 1e6 * cpu / max(queries, 1)
            cell["proxy_user_us_per_query"] = 1e6 * user / max(queries, 1)
            cell["proxy_kernel_us_per_query"] = 1e6 * kernel / max(queries, 1)
            cell["proxy_rss_kb"] = proc_rss_kb(t.pid)
        return cell

    def server_cpu(self, t=None):
        """utime+stime so far, in seconds, of the server behind target `t` (its own, as the TiDB
        suite's targets have), else of the main MariaDB server (None: not known)."""
        pid = getattr(t, "server_pid", None) or getattr(self, "server_pid", None)
        try:
            return sum(proc_cpu_split(pid)) if pid else None
        except OSError:
            return None

    def stop(self):
        for t in self.targets.values():
            t.stop()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def root_sql(sock, sql):
    """Runs `sql` as root over a server's socket; its output, trimmed."""
    return subprocess.run(["mariadb", f"--socket={sock}", "-uroot", "-N", "-e", sql],
                          check=True, capture_output=True, text=True).stdout.strip()


def sockets_by_port(directory):
    """The Unix sockets of the servers sluice-mariadb started under `directory`, by TCP port."""
    return {int(root_sql(sock, "SELECT @@port")): str(sock) for sock in Path(directory).glob("db-*/mariadb.sock")}


def prepare_tables(env, port, sock, log_as="the server"):
    a = env.args
    log(f"preparing sbtest on {log_as}: {a.tables} table(s) of {a.table_size} rows")
    base = ["sysbench", "oltp_common", "--db-driver=mysql", "--mysql-user=sbtest", "--mysql-password=sbtest",
            "--mysql-db=sbtest", "--mysql-host=127.0.0.1", f"--mysql-port={port}",
            f"--tables={a.tables}", f"--table-size={a.table_size}"]
    # Thousands of clients preparing sysbench's statements (up to 20 each) directly or through
    # HAProxy would pass the server's default limit of 16382 (MariaDB; TiDB: no socket given).
    if sock:
        root_sql(sock, "SET GLOBAL max_prepared_stmt_count = 1048576")
    subprocess.run(base + ["cleanup"], capture_output=True)
    subprocess.run(base + ["prepare"], check=True, capture_output=True)


# Figures taken as the largest of the rounds rather than the median: an allocator that keeps
# freed memory for reuse (HAProxy's pools) shows no growth for the same connections again in
# later rounds, so only the worst round measures what a connection costs.
WORST_OF_ROUNDS = {"rss_per_idle_conn_kb", "kb_per_idle_client"}


def median_cells(results):
    out = {}
    for key, cells in results.items():
        med = {f: (max if f in WORST_OF_ROUNDS else statistics.median)(c[f] for c in cells)
               for f in cells[0] if isinstance(cells[0][f], (int, float))}
        # (Text figures, such as the failover suite's error codes: the last round's.)
        med.update({f: v for f, v in cells[-1].items() if isinstance(v, str)})
        med["rounds"] = len(cells)
        med["discarded"] = sum(len(c.get("discarded_steal_pct", [])) for c in cells)
        med["qps_rounds"] = [c.get("qps") for c in cells]
        med["min_qps_rounds"] = [c.get("min_qps") for c in cells]
        if all("qps_samples" in c for c in cells):
            # Seconds under half the round's median second: the host's stalls (the capture
            # suite's seconds show them with capture off as with it on).
            med["stalled_seconds"] = sum(sum(q < statistics.median(c["qps_samples"]) / 2 for q in c["qps_samples"]) for c in cells)
        out[key] = med
    return out


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default=None, help="results directory name (default: a timestamp)")
    p.add_argument("--duration", type=int, default=20, help="seconds per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="1,8,32,64", help="client threads for the basic and scaling suites")
    p.add_argument("--table-size", type=int, default=100000)
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--workers", type=int, default=1, help="proxy worker threads (sluice and HAProxy)")
    p.add_argument("--suites", default=",".join(ALL_SUITES), help=f"any of {ALL_SUITES + EXTRA_SUITES}")
    p.add_argument("--workloads", default=",".join(suites.BASIC))
    p.add_argument("--range-sizes", default=",".join(map(str, suites.RANGE_SIZES)))
    p.add_argument("--range-threads", type=int, default=32)
    p.add_argument("--long-threads", type=int, default=32)
    p.add_argument("--idle-conns", type=int, default=0, help="idle connections for the long suite (0: from the fd limit)")
    p.add_argument("--churn-rate", type=int, default=1000, help="new connections per second for the short suite")
    p.add_argument("--mux-clients", default="1000,2000", help="client connections of the multiplex suite")
    p.add_argument("--mux-cap", type=int, default=32, help="max_backend_connections of the multiplexing sluice")
    p.add_argument("--idle-clients", type=int, default=3000, help="idle driver connections of the idle suite")
    p.add_argument("--split-threads", default="8,64,256", help="client threads of the split suite")
    p.add_argument("--capture-threads", default="20,50,100", help="client threads of the capture suite")
    p.add_argument("--capture-phase", type=int, default=5, help="seconds between switches of capture in its suite's runs")
    p.add_argument("--server-options", default=SERVER_OPTIONS,
                   help="options of the benchmarks' MariaDB server beyond the tests' (its data in memory, and a redo log "
                        "that does not stall writes on checkpoints)")
    p.add_argument("--capture-dir", default=None, help="where the capture suite's captures go (default: the work directory)")
    p.add_argument("--capture-phases", type=int, default=12, help="phases of each capture suite run (off and on in turn)")
    p.add_argument("--drain-sessions", default="16,1000", help="idle sessions moved by a drain in the drain suite")
    p.add_argument("--failover-rows", type=int, default=10000, help="rows of each of the failover suite's 2 tables")
    p.add_argument("--failover-duration", type=int, default=30, help="seconds of each failover suite run (the loss a third in)")
    p.add_argument("--tidb-threads", default="8,32", help="sysbench threads of the TiDB suite's basic workloads")
    p.add_argument("--steal-limit", type=float, default=5.0,
                   help="a measurement during which the host stole more than this %% of the CPU is taken again")
    p.add_argument("--steal-retries", type=int, default=2, help="how many times at most (0: never)")
    p.add_argument("--steal-pause", type=float, default=10.0, help="seconds to wait before measuring again")
    p.add_argument("--pgo", action="store_true",
                   help="also measure sluice's profile-guided build (scripts/pgo.sh builds it) in the floor and tidb suites")
    p.add_argument("--report-only", action="store_true",
                   help="write report.md and the charts again from bench/results/<name>/raw.json, measuring nothing")
    p.add_argument("--smoke", action="store_true", help="every suite at minimal size, to check the harness")
    p.add_argument("--merge", action="store_true",
                   help="measure only --suites, and put their cells in the existing bench/results/<name> in place of "
                        "those its run measured (the report says which suites were measured again, how and when)")
    a = p.parse_args()
    if a.smoke:
        a.duration, a.rounds, a.threads, a.table_size, a.tables = 2, 1, "4", 1000, 1
        a.range_sizes, a.idle_conns, a.churn_rate = "10,100", 50, 50
        a.mux_clients, a.mux_cap, a.idle_clients, a.drain_sessions = "40", 4, 50, "16"
        a.split_threads, a.capture_threads, a.capture_phase, a.capture_phases = "4", "4", 2, 4
        a.failover_rows, a.failover_duration = 1000, 12
        a.tidb_threads = "4"
        a.workloads = "oltp_point_select,oltp_read_only"
        a.steal_retries = 0
        a.pgo = True  # (its build and training too, so that they cannot rot)
        a.name = a.name or "smoke"
    a.name = a.name or time.strftime("%Y%m%d-%H%M%S")
    a.threads = [int(x) for x in a.threads.split(",")]
    a.suites = a.suites.split(",")
    a.workloads = a.workloads.split(",")
    a.range_sizes = [int(x) for x in a.range_sizes.split(",")]
    a.mux_clients = [int(x) for x in a.mux_clients.split(",")]
    a.drain_sessions = [int(x) for x in a.drain_sessions.split(",")]
    a.split_threads = [int(x) for x in a.split_threads.split(",")]
    a.capture_threads = [int(x) for x in a.capture_threads.split(",")]
    a.tidb_threads = [int(x) for x in a.tidb_threads.split(",")]
    if a.idle_conns == 0:
        # Each idle client costs the proxy two descriptors, and the backend one connection.
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        a.idle_conns = max(100, min(3000, soft // 2 - 500))
    return a


def measure_quiet(env, cell, target, args, label):
    """Measures one cell on one target. A measurement during which the host stole more than
    --steal-limit percent of the machine's CPU is taken again, up to --steal-retries times (after
    a pause, as steal comes in bursts), and the one with the least steal is kept; its figures say
    the steal of the others, so the report can say how many were discarded."""
    tries = []
    while True:
        figures = suites.measure(env, cell, target, args)
        steal = figures.get("machine_steal_pct")
        cpu = figures.get("proxy_cpu_us_per_query")
        if "qps" in figures:
            log(f"{label}: {figures['qps']:.0f} qps" + (f", {cpu:.1f} us/query" if cpu is not None else "")
                + (f" (capture off: {figures['qps_off']:.0f} qps, {figures['cpu_off']:.1f} us/query)" if "qps_off" in figures else "")
                + (f", steal {steal:.0f}%" if steal and steal > args.steal_limit else ""))
        else:
            log(f"{label}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items() if isinstance(v, (int, float))))
        tries.append(figures)
        if steal is None or steal <= args.steal_limit or len(tries) > args.steal_retries:
            break
        log(f"{label}: measuring again after {args.steal_pause:g} s, the host stole {steal:.0f}% of the CPU")
        time.sleep(args.steal_pause)
    kept = min(tries, key=lambda f: f.get("machine_steal_pct") or 0)
    if len(tries) > 1:
        kept["discarded_steal_pct"] = [round(f["machine_steal_pct"], 1) for f in tries if f is not kept]
    return kept


def rewrite_report(cli):
    """Renders a results directory again from its raw JSON (after a change to the report). The
    run's own arguments win; options it predates take this command line's values."""
    name = cli.name
    out = ROOT / "bench" / "results" / name
    raw = json.loads((out / "raw.json").read_text())
    args = argparse.Namespace(**{**vars(cli), **raw["args"]})
    if "capture_phase" not in raw["args"]:
        args.capture_phase = None  # (its capture suite measured off and on in two runs)
    med = median_cells(raw["rounds"])
    report.ensure_matplotlib()
    report.write(med, args, out, raw.get("command", f"bench/bench.py --name {name} (command not recorded)"))
    raw["median"] = med
    (out / "raw.json").write_text(json.dumps(raw, indent=1))
    log(f"report: {out / 'report.md'}")


def merged(out, new):
    """The results in `out` with the cells of `new`'s suites replaced by `new`'s (same rounds and
    duration), and a note of when and how those suites were measured again."""
    raw = json.loads((out / "raw.json").read_text())
    old_args, args = raw["args"], new["args"]
    if (old_args["rounds"], old_args["duration"]) != (args["rounds"], args["duration"]):
        raise SystemExit(f"--merge: {out} has {old_args['rounds']} rounds of {old_args['duration']} s; measure the same")
    suites = args["suites"]
    prefixes = tuple(f"{s}/" for s in suites)
    rounds = {k: v for k, v in raw["rounds"].items() if not k.startswith(prefixes)}
    rounds.update(new["rounds"])
    # The suites' own options are the new run's.
    own = {k: v for k, v in args.items() if k.split("_")[0] in suites}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    again = old_args.get("remeasured", []) + [{"suites": suites, "command": new["command"], "commit": commit,
                                               "date": time.strftime("%Y-%m-%d")}]
    return {**raw, "args": {**old_args, **own, "remeasured": again}, "rounds": rounds}


def main():
    args = parse_args()
    if args.report_only:
        return rewrite_report(args)
    subprocess.run([str(ROOT / "scripts/setup.sh"), "sysbench", "haproxy"], check=True)
    report.ensure_matplotlib()
    if "idle" in args.suites or "drain" in args.suites or "failover" in args.suites:
        suites.ensure_pymysql()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice", "-p", "sluice-testkit"], cwd=ROOT, check=True)
    if args.pgo:
        seconds = "1" if args.smoke else os.environ.get("PGO_SECONDS", "5")
        subprocess.run([str(ROOT / "scripts/pgo.sh")], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, PGO_SECONDS=seconds))
    # A fresh work directory, except bench/work/soak: a `make soak` may be running.
    WORK.mkdir(parents=True, exist_ok=True)
    for p in WORK.iterdir():
        if p.name != "soak":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    env = Env(args)
    try:
        env.start_backend()
        prepare_tables(env, env.backend_port, env.targets["direct"].socket_path)
        env.start_haproxy("haproxy", env.backend_port)
        env.start_sluice("sluice", env.backend_port, args.workers)
        if "runtime" in args.suites:
            env.start_sluice("sluice-multi", env.backend_port, args.workers, "multi")
        if "multiplex" in args.suites or "idle" in args.suites:
            env.start_sluice_mux("sluice-mux", env.backend_port, args.workers, args.mux_cap)
        if "idle" in args.suites:
            env.start_sluice_mux("sluice-mux-plain", env.backend_port, args.workers, args.mux_cap, tls=False)
        if "drain" in args.suites:
            env.start_sluice_two_addresses("sluice-2addr", env.backend_port, args.workers, False)
            env.start_sluice_two_addresses("sluice-2addr-mux", env.backend_port, args.workers, True)
        if "split" in args.suites:
            env.start_topology()
            env.start_haproxy("split-haproxy", env.repl_ports[1], env.repl_ports[2:])
            env.start_sluice_split("sluice-split", args.workers)
        if "features" in args.suites:
            env.start_features(args.workers)
        if "capture" in args.suites:
            backend = f'[[backends]]\naddress = "127.0.0.1:{env.backend_port}"\n'
            env.start_sluice_users("sluice-capture", args.workers, 'tls = "off"\n', "", backend)
        if "tidb" in args.suites:
            tidb.start(env, args, lambda env, port: prepare_tables(env, port, None, log_as="the tidb-server"), Target)
        if "floor" in args.suites:
            env.start_forward("forward-epoll", "epoll", env.backend_port)
            env.start_forward("forward-uring", "uring", env.backend_port)
            env.start_forward("forward-tokio", "tokio", env.backend_port)
            if args.pgo:
                env.start_sluice("sluice-pgo", env.backend_port, args.workers, binary=PGO_SLUICE)
        if "scaling" in args.suites:
            env.start_sluice("sluice-1w", env.backend_port, 1)
            env.start_sluice("sluice-2w", env.backend_port, 2)
            env.start_responder()
            env.start_haproxy("haproxy-resp", env.responder_port)
            env.start_sluice("sluice-1w-resp", env.responder_port, 1)
            env.start_sluice("sluice-2w-resp", env.responder_port, 2)
        plan = suites.cells(env, args)
        results = {}
        for rnd in range(args.rounds):
            for cell in plan:
                # The order of the targets rotates from round to round, so that none always
                # runs first, or right after another's writes.
                shift = rnd % len(cell.targets)
                for target in cell.targets[shift:] + cell.targets[:shift]:
                    figures = measure_quiet(env, cell, target, args, f"round {rnd + 1}/{args.rounds} {cell.key(target)}")
                    # (A measurement of two targets in one run gives each its figures.)
                    for name, fig in figures.pop("halves", {target: figures}).items():
                        results.setdefault(cell.key(name), []).append(fig)
        out = ROOT / "bench" / "results" / args.name
        out.mkdir(parents=True, exist_ok=True)
        command = " ".join(sys.argv)
        raw = {"args": vars(args), "command": command, "rounds": results}
        if args.merge:
            raw = merged(out, raw)
            args = argparse.Namespace(**raw["args"])
        med = raw["median"] = median_cells(raw["rounds"])
        (out / "raw.json").write_text(json.dumps(raw, indent=1))
        report.write(med, args, out, raw["command"])
        log(f"report: {out / 'report.md'}")
        missing = [k for c in plan for k in c.result_keys() if k not in med]
        # Every planned cell must have produced numbers (a cell, not a threshold, passes).
        print(f"bench: {len(med)} passed, {len(missing)} failed")
        if missing:
            raise SystemExit(f"cells without numbers: {missing}")
    finally:
        env.stop()


if __name__ == "__main__":
    main()
