"""The failover suite: the primary of a fresh replicated topology (sluice-mariadb --replicas 2,
semi-synchronous GTID replication) is lost, or switched over, under load (16 clients of PyMySQL
running short read-write transactions, as a user without SUPER), once through sluice and once
through HAProxy.

- sluice: users mode, the read/write split, `[failover] enabled`: it notices the loss, promotes a
  replica and carries the sessions there (transaction replay, a lost COMMIT resolved from the
  commit table); a switchover is `POST /cluster/switchover`.
- HAProxy: TCP mode, the primary and, as a `backup` server, a replica; `option mysql-check` (a
  login, so that a hung server fails its checks) and `on-marked-down shutdown-sessions`. HAProxy
  knows no roles: the script promotes the replica the moment the primary is lost, as an external
  tool (Orchestrator, MHA) would at its very best, with no detection time of its own. A
  switchover is done by hand the way an operator would: the primary made read-only, the replica
  caught up and promoted, the old primary put in maintenance with its sessions shut.

Both have the same detection: checks every 500 ms, 1 s timeout, down after 2 failures. Figures:
the write outage (a probe client writes through the proxy every 10 ms, reconnecting as it must:
the longest time without a successful write from the loss on), and the errors and reconnects
the clients saw.
"""

import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

from ports import free_ports, wait_port

LOSSES = ["crash", "hang", "switchover"]
TARGETS = ["sluice-failover", "haproxy-failover"]
THREADS = 16
USER, PASSWORD = "writer", "writerpw"


def root_sql(sock, sql):
    return subprocess.run(["mariadb", f"--socket={sock}", "-uroot", "-N", "-e", sql],
                          check=True, capture_output=True, text=True, timeout=120).stdout.strip()


def server_pid(port):
    """The pid of the mariadbd listening on `port` (its command line names the port)."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if f"--port={port}".encode() in args:
                return int(d)
    raise RuntimeError(f"no server process on port {port}")


class Topology:
    """A primary (index 0) and two replicas, their sockets and pids."""

    def __init__(self, env, name):
        self.dir = env.work / name
        self.proc = env.spawn([str(env.root / "target/release/sluice-mariadb"), "--replicas", "2", "--dir", str(self.dir)],
                              f"{name}.log", stdout=subprocess.PIPE)
        self.ports = [int(self.proc.stdout.readline().strip().rsplit(":", 1)[1]) for _ in range(3)]
        by_port = {}
        for db in self.dir.glob("db-*/mariadb.sock"):
            by_port[int(root_sql(db, "SELECT @@port"))] = str(db)
        self.socks = [by_port[p] for p in self.ports]
        self.pids = [server_pid(p) for p in self.ports]

    def caught_up(self, source, replicas, limit=120):
        pos = root_sql(self.socks[source], "SELECT @@gtid_binlog_pos")
        for i in replicas:
            if root_sql(self.socks[i], f"SELECT MASTER_GTID_WAIT('{pos}', {limit})") != "0":
                raise RuntimeError(f"server {i} did not catch up with server {source}")

    def promote(self, i):
        """As a failover tool does it: the replica applies what it received, stops replicating,
        forgets its primary and takes writes."""
        status = subprocess.run(["mariadb", f"--socket={self.socks[i]}", "-uroot", "-e", "SHOW SLAVE STATUS\\G"],
                                check=True, capture_output=True, text=True, timeout=60).stdout
        received = re.search(r"Gtid_IO_Pos:\s*(\S*)", status)
        if received and received.group(1):
            root_sql(self.socks[i], f"SELECT MASTER_GTID_WAIT('{received.group(1)}', 60)")
        root_sql(self.socks[i], "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")

    def follow(self, i, source, demote=False):
        more = ", MASTER_DEMOTE_TO_SLAVE = 1" if demote else ""
        root_sql(self.socks[i], f"SET GLOBAL read_only = 1; STOP SLAVE; CHANGE MASTER TO MASTER_HOST = '127.0.0.1', "
                                f"MASTER_PORT = {self.ports[source]}, MASTER_USER = 'app', MASTER_PASSWORD = 'apppw', "
                                f"MASTER_USE_GTID = slave_pos{more}; START SLAVE")

    def stop(self):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        self.proc.terminate()
        self.proc.wait(30)


def start_sluice(env, name, topo):
    port, admin = free_ports(2)
    cfg = env.work / f"{name}.toml"
    backends = "".join(f'[[backends]]\naddress = "127.0.0.1:{p}"\nname = "s{i}"\n' for i, p in enumerate(topo.ports))
    cfg.write_text(f"""[[listeners]]
address = "127.0.0.1:{port}"
[admin]
listen = "127.0.0.1:{admin}"
[proxy]
workers = {env.args.workers}
[health]
interval = "500ms"
timeout = "1s"
fall = 2
user = "monitor"
password = "monitorpw"
[failover]
enabled = true
user = "app"
password = "apppw"
after = "1s"
[routing]
split = true
commit_table = "sluice.commits"
{backends}[[users]]
name = "{USER}"
password = "{PASSWORD}"
""")
    p = env.spawn([str(env.root / "target/release/sluice"), "--config", str(cfg)], f"{name}.log")
    wait_port(port, p)
    deadline = time.time() + 60
    while time.time() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/cluster/failover", timeout=5) as r:
            found = b'"primary":"s0"' in r.read()
        made = root_sql(topo.socks[0], "SELECT COUNT(*) FROM information_schema.tables "
                                       "WHERE table_schema = 'sluice' AND table_name = 'commits'") == "1"
        if found and made:
            return p, port, admin
        time.sleep(0.1)
    raise RuntimeError("sluice did not find the primary and make its commit table")


def start_haproxy(env, name, topo):
    port = free_ports(1)[0]
    stats = env.work / f"{name}.stats"
    cfg = env.work / f"{name}.cfg"
    check = "check inter 500 fall 2 rise 2"
    cfg.write_text(f"""global
    maxconn 1000
    nbthread {env.args.workers}
    stats socket {stats} level admin
defaults
    mode tcp
    timeout connect 1s
    timeout check 1s
    timeout client 3600s
    timeout server 3600s
listen mysql
    bind 127.0.0.1:{port}
    option mysql-check user nopw post-41
    server db1 127.0.0.1:{topo.ports[0]} {check} on-marked-down shutdown-sessions
    server db2 127.0.0.1:{topo.ports[1]} {check} backup on-marked-down shutdown-sessions
""")
    p = env.spawn(["haproxy", "-db", "-f", str(cfg)], f"{name}.log")
    wait_port(port, p)
    return p, port, stats


def haproxy_command(stats, command):
    """A command on HAProxy's stats socket (admin level)."""
    with socket.socket(socket.AF_UNIX) as c:
        c.settimeout(10)
        c.connect(str(stats))
        c.sendall(command.encode() + b"\n")
        while c.recv(4096):
            pass


class Load:
    """THREADS clients running short read-write transactions through the proxy (two reads, two
    writes, COMMIT), each reconnecting when its connection is lost, as an application's pool
    would. (sysbench 1.0 is not used here: it crashes when it reconnects.)"""

    def __init__(self, port, rows):
        self.port, self.rows, self.stop = port, rows, threading.Event()
        self.lock = threading.Lock()
        self.done, self.errors, self.reconnects = 0, {}, 0
        self.started = time.monotonic()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(THREADS)]
        for t in self.threads:
            t.start()

    def connect(self):
        import pymysql
        return pymysql.connect(host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, database="sbtest",
                               connect_timeout=2, read_timeout=30, write_timeout=30)

    def run(self, i):
        import random

        import pymysql
        rnd = random.Random(i)
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = self.connect()
                a, b = rnd.randint(1, self.rows), rnd.randint(1, self.rows - 10)
                with conn.cursor() as c:
                    c.execute("BEGIN")
                    c.execute("SELECT c FROM sbtest1 WHERE id = %s", (a,))
                    c.fetchall()
                    c.execute("SELECT SUM(k) FROM sbtest2 WHERE id BETWEEN %s AND %s", (b, b + 10))
                    c.fetchall()
                    c.execute("UPDATE sbtest1 SET k = k + 1 WHERE id = %s", (a,))
                    c.execute("UPDATE sbtest2 SET c = %s WHERE id = %s", (f"{i}-{time.time()}", b))
                    c.execute("COMMIT")
                with self.lock:
                    self.done += 1
            except pymysql.err.MySQLError as e:
                code = e.args[0] if e.args and isinstance(e.args[0], int) else 0
                with self.lock:
                    self.errors[code] = self.errors.get(code, 0) + 1
                lost = code in (0, 2003, 2006, 2013) or not (conn and conn.open)
                if lost:
                    if conn is not None:
                        try:
                            conn.close()
                        except Exception:  # noqa: BLE001
                            pass
                    if conn is not None:
                        with self.lock:
                            self.reconnects += 1
                    conn = None
                    time.sleep(0.01)
                else:
                    try:
                        conn.rollback()
                    except Exception:  # noqa: BLE001
                        conn = None
        if conn is not None:
            conn.close()

    def stop_and_count(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        took = time.monotonic() - self.started
        return {"transactions": float(self.done), "tps": self.done / took, "errors": float(sum(self.errors.values())),
                "reconnects": float(self.reconnects),
                "error_codes_text": ", ".join(f"{code} x{n}" for code, n in sorted(self.errors.items()))}


class Probe:
    """A client that writes through the proxy every 10 ms (reconnecting when it must) and notes
    when each write succeeded."""

    def __init__(self, port):
        self.port, self.ok, self.stop = port, [], threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        import pymysql
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = pymysql.connect(host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, database="sbtest",
                                           connect_timeout=2, read_timeout=5, write_timeout=5, autocommit=True)
                with conn.cursor() as c:
                    c.execute("INSERT INTO probe (at) VALUES (%s)", (time.time(),))
                self.ok.append(time.monotonic())
            except Exception:  # noqa: BLE001 (every failure is a write that did not succeed)
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass
                conn = None
            time.sleep(0.01)

    def outage(self, t0, done, limit=120):
        """Once a write succeeded after `done` (the loss handled): the longest time without a
        successful write from t0 on."""
        deadline = time.monotonic() + limit
        while not any(t > done for t in self.ok) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop.set()
        self.thread.join(30)
        ok = list(self.ok)
        if not any(t > done for t in ok):
            raise RuntimeError(f"no write succeeded through port {self.port} within {limit} s of the loss")
        before = [t for t in ok if t <= t0]
        times = ([before[-1]] if before else [t0]) + [t for t in ok if t > t0]
        return max(b - a for a, b in zip(times, times[1:]))


def lose(env, target, loss, topo, proxy):
    """Loses (or switches over) the primary; for HAProxy, also what its operator does."""
    if loss == "crash":
        os.kill(topo.pids[0], signal.SIGKILL)
    elif loss == "hang":
        os.kill(topo.pids[0], signal.SIGSTOP)
    if target.startswith("sluice"):
        if loss == "switchover":
            import json
            req = urllib.request.Request(f"http://127.0.0.1:{proxy[2]}/cluster/switchover", data=json.dumps({"to": "s1"}).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=120).read()
        return
    if loss == "switchover":
        root_sql(topo.socks[0], "SET GLOBAL read_only = 1")
        topo.caught_up(0, [1])
    topo.promote(1)
    if loss == "switchover":
        haproxy_command(proxy[2], "set server mysql/db1 state maint")
        haproxy_command(proxy[2], "shutdown sessions server mysql/db1")
        topo.follow(0, 1, demote=True)
    topo.follow(2, 1)


def measure(env, cell, target, args):
    """One loss on a fresh topology: its figures."""
    loss = cell.loss
    env.failover_runs = getattr(env, "failover_runs", 0) + 1
    name = f"fo-{target}-{loss}-{env.failover_runs}"
    topo = Topology(env, name)
    proxy = None
    try:
        root_sql(topo.socks[0], f"CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; GRANT ALL ON sbtest.* TO '{USER}'@'%'; "
                                f"GRANT SELECT, INSERT, UPDATE ON sluice.* TO '{USER}'@'%'; "
                                "CREATE TABLE sbtest.probe (id BIGINT AUTO_INCREMENT PRIMARY KEY, at DOUBLE)")
        rows = args.failover_rows
        prepare = ["sysbench", "oltp_common", "--db-driver=mysql", f"--mysql-user={USER}", f"--mysql-password={PASSWORD}",
                   "--mysql-db=sbtest", "--tables=2", f"--table-size={rows}", "--mysql-host=127.0.0.1",
                   f"--mysql-port={topo.ports[0]}", "prepare"]
        subprocess.run(prepare, check=True, capture_output=True)
        topo.caught_up(0, [1, 2])
        if target.startswith("sluice"):
            proxy = start_sluice(env, name, topo)
        else:
            proxy = start_haproxy(env, name, topo)
        port = proxy[1]
        duration = args.failover_duration
        load = Load(port, rows)
        probe = Probe(port)
        time.sleep(duration / 3)
        t0 = time.monotonic()
        lose(env, target, loss, topo, proxy)
        outage = probe.outage(t0, time.monotonic())
        # (The loss and the probe's writes around it, in wall-clock time, to read against the
        # proxy's log.)
        wall = time.time() - time.monotonic()
        around = [f"{t + wall:.3f}" for t in probe.ok if t0 - 1 < t < t0 + 15]
        (env.work / f"{name}.probe").write_text(f"loss at {t0 + wall:.3f}\nwrites at {' '.join(around)}\n")
        time.sleep(max(0.0, duration - (time.monotonic() - t0) - duration / 3))
        figures = load.stop_and_count()
        figures["write_outage_s"] = outage
        return figures
    finally:
        if proxy is not None:
            proxy[0].terminate()
            proxy[0].wait(30)
        topo.stop()


def report(med, args, lines, f, get):
    lines += [__doc__.split("\n\n", 1)[1].strip(), "",
              f"{THREADS} clients, 2 tables of {args.failover_rows} rows, {args.failover_duration} s per run, the loss "
              f"a third of the way in; the median of {args.rounds} round(s).", "",
              "| loss | target | write outage (s) | client errors | reconnects | transactions/s over the run |",
              "|---|---|---|---|---|---|"]
    for loss in LOSSES:
        for t in TARGETS:
            k = f"failover/{loss}/{t}"
            if k in med:
                lines.append(f"| {loss} | {t} | {f(get(med, k, 'write_outage_s'), 2)} | {f(get(med, k, 'errors'))} "
                             f"| {f(get(med, k, 'reconnects'))} | {f(get(med, k, 'tps'))} |")
    lines.append("")
    lines += ["Error codes (in the last round): "
              + "; ".join(f"{k}: {get(med, k, 'error_codes_text') or 'none'}" for k in sorted(med) if k.startswith("failover/")), ""]
