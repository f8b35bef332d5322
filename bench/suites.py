"""Benchmark suites. Each suite yields cells; a cell is measured once per round on every target
it names, rounds interleaved, so that slow drift of the machine hits all targets alike.

A cell key is "suite/variant/target"; its value per round is a dict of figures.
"""

import os
import re
import subprocess
import sys
import threading
import time

import capture_cost
import failover
import tidb

BASIC = ["oltp_point_select", "oltp_read_only", "oltp_write_only", "oltp_read_write"]
RANGE_SIZES = [10, 100, 1000, 10000]
# The range size of the CPU target, measured again in the floor suite.
FLOOR_RANGE = 1000
# Only simple ranges, no transactions: the cost of the rows themselves.
RANGE_ARGS = ["--skip_trx=on", "--point_selects=0", "--simple_ranges=1", "--sum_ranges=0",
              "--order_ranges=0", "--distinct_ranges=0"]


class Cell:
    """One measurement: a sysbench workload against a target, with optional companions."""

    def __init__(self, suite, variant, workload, threads, targets, extra=(), unix=False, hold=0, churn=0, ps=True,
                 sample=False, idle=0, drain=0, capture=False, loss=None):
        self.suite, self.variant, self.workload, self.threads = suite, variant, workload, threads
        self.targets, self.extra, self.unix, self.hold, self.churn, self.ps = targets, list(extra), unix, hold, churn, ps
        # sample: the backend's connections and the proxy's memory halfway through the run;
        # idle: a driver's idle connections, held, instead of a workload.
        self.sample, self.idle, self.drain = sample, idle, drain
        # capture: capture switched off and on in turn during the run (capture_cost.py).
        self.capture = capture
        # loss: the primary of a fresh topology lost this way during the run (failover.py).
        self.loss = loss

    def key(self, target):
        return f"{self.suite}/{self.variant}/{target}"

    def result_keys(self):
        """The keys its measurements give figures for (a capture run measures off and on)."""
        names = ["capture-off", "capture-on"] if self.capture else self.targets
        return [self.key(n) for n in names]


def cells(env, args):
    """Every cell of the suites selected by --suites."""
    main = [t for t in ("direct", "haproxy", "sluice") if t in env.targets]
    proxies = [t for t in main if t != "direct"]
    out = []
    suites = args.suites
    if "basic" in suites:
        for threads in args.threads:
            for w in args.workloads:
                out.append(Cell("basic", f"{w}/{threads}", w, threads, main + env.extra_basic))
    if "ranges" in suites:
        for size in args.range_sizes:
            extra = RANGE_ARGS + [f"--range_size={size}"]
            out.append(Cell("ranges", f"{size}", "oltp_read_only", args.range_threads, main, extra))
    if "latency" in suites:
        out.append(Cell("latency", "tcp", "oltp_point_select", 1, main))
        out.append(Cell("latency", "unix", "oltp_point_select", 1, main, unix=True))
    if "long" in suites:
        out.append(Cell("long", "0", "oltp_point_select", args.long_threads, proxies))
        out.append(Cell("long", f"{args.idle_conns}", "oltp_point_select", args.long_threads, proxies, hold=args.idle_conns))
    if "short" in suites:
        out.append(Cell("short", "0", "oltp_point_select", args.long_threads, proxies))
        out.append(Cell("short", f"{args.churn_rate}", "oltp_point_select", args.long_threads, proxies, churn=args.churn_rate))
        # What one new connection costs each process, with nothing else running.
        out.append(Cell("short", "cost", None, 0, main, churn=args.churn_rate))
    if "runtime" in suites:
        # Runtime flavours: per-core (sluice) against one work-stealing runtime (sluice-multi).
        for threads in args.threads:
            for w in args.workloads[:2]:
                out.append(Cell("runtime", f"{w}/{threads}", w, threads, ["haproxy", "sluice", "sluice-multi"]))
    if "scaling" in suites:
        # Proxy-bound: sluice (1 or 2 workers) and HAProxy in front of the minimal responder,
        # with client-side statements (the responder does not prepare).
        for threads in args.threads:
            out.append(Cell("scaling", f"responder/{threads}", "oltp_point_select", threads,
                            ["haproxy-resp", "sluice-1w-resp", "sluice-2w-resp"], ps=False))
            out.append(Cell("scaling", f"mariadb/{threads}", "oltp_point_select", threads, ["sluice-1w", "sluice-2w"]))
    if "multiplex" in suites:
        # Many clients over few backend connections: sluice multiplexing (users mode, at most
        # --mux-cap backend connections) against direct and HAProxy, which hold one each.
        mux = [t for t in ("direct", "haproxy", "sluice-mux") if t in env.targets]
        for w in args.workloads[:2]:
            for clients in args.mux_clients:
                out.append(Cell("multiplex", f"{w}/{clients}", w, clients, mux, sample=True))
    if "idle" in suites:
        idle = [t for t in ("haproxy", "sluice", "sluice-mux", "sluice-mux-plain") if t in env.targets]
        out.append(Cell("idle", f"{args.idle_clients}", None, 0, idle, idle=args.idle_clients))
    if "drain" in suites:
        two = [t for t in ("sluice-2addr", "sluice-2addr-mux") if t in env.targets]
        for n in args.drain_sessions:
            out.append(Cell("drain", f"{n}", None, 0, two, drain=n))
    if "split" in suites:
        # The seed's topology: a primary and two replicas; reads through sluice's split, through
        # HAProxy spreading over the replicas, and directly to one replica. oltp_read_only
        # without its BEGIN/COMMIT, as in the seed (a transaction's reads belong on the primary).
        split = [t for t in ("split-direct", "split-haproxy", "sluice-split") if t in env.targets]
        for w in ("oltp_point_select", "oltp_read_only"):
            extra = ["--skip_trx=on"] if w == "oltp_read_only" else []
            for transport in ("tcp", "unix"):
                for threads in args.split_threads:
                    out.append(Cell("split", f"{w}/{transport}/{threads}", w, threads, split, extra, unix=transport == "unix"))
    if "features" in suites:
        # The hot-path cost of digests, of 100 regex rules and of the split's classifier, each
        # against sluice without it (users mode, TLS off, one server).
        feats = [t for t in ("feat-bare", "feat-digests", "feat-rules100", "feat-mux", "feat-split") if t in env.targets]
        for w in args.workloads[:2]:
            for threads in args.threads:
                out.append(Cell("features", f"{w}/{threads}", w, threads, feats))
    if "capture" in suites:
        # The TiProxy seed's capture table: oltp_read_write with capture off and on, in turn
        # within one run (capture_cost.py); its figures go to capture-off and capture-on.
        for threads in args.capture_threads:
            out.append(Cell("capture", f"oltp_read_write/{threads}", "oltp_read_write", threads, ["sluice-capture"],
                            capture=True))
    if "failover" in suites:
        # The primary lost under load (or switched over), through sluice and through HAProxy,
        # each run on a fresh replicated topology (failover.py).
        for loss in failover.LOSSES:
            out.append(Cell("failover", loss, "oltp_read_write", failover.THREADS, failover.TARGETS, loss=loss))
    if "tidb" in suites:
        # The TiProxy report's tables in front of one tidb-server (tidb.py).
        out += tidb.cells(args, Cell, RANGE_ARGS)
    if "floor" in suites:
        # The cells of the CPU targets, also on two forwarders that relay bytes and do nothing
        # else (sluice-forward): what relaying costs on each event loop, with no protocol work.
        floor = [t for t in ("haproxy", "sluice", "sluice-pgo", "forward-epoll", "forward-uring", "forward-tokio")
                 if t in env.targets]
        for w in args.workloads[:2]:
            for threads in args.threads:
                out.append(Cell("floor", f"{w}/{threads}", w, threads, floor))
        size = FLOOR_RANGE if FLOOR_RANGE in args.range_sizes else max(args.range_sizes)
        out.append(Cell("floor", f"ranges-{size}/{args.range_threads}", "oltp_read_only", args.range_threads, floor,
                        RANGE_ARGS + [f"--range_size={size}"]))
    return out


def admin(t, path, body=None):
    """A request to a target's admin API (POST with a JSON body, or GET); its JSON answer."""
    import json
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{t.admin_port}{path}", data=data,
                                 method="GET" if body is None else "POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def replay_rate(env, cap_dir):
    """Replays a capture against the server as fast as it goes, in order: commands per second."""
    t0 = time.time()
    r = subprocess.run([str(env.root / "target/release/sluice"), "replay", "--input", str(cap_dir), "--target",
                        f"127.0.0.1:{env.backend_port}", "--user", "sbtest", "--password", "sbtest", "--speed", "1000"],
                       capture_output=True, text=True)
    took = time.time() - t0
    m = re.search(r"replayed (\d+) of (\d+) commands .*: (\d+) same, (\d+) different", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"replay failed: {r.stdout}{r.stderr}")
    return int(m.group(1)) / took


def ensure_pymysql():
    try:
        import pymysql  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "pymysql"], check=True)


def idle_clients(env, cell, target):
    """Holds --idle-clients connections of a real driver (PyMySQL: a schema, connection
    attributes), opened 64 at a time: the proxy's memory per connection and the backend
    connections they cost."""
    t = env.targets[target]
    rss0, threads0 = env.rss(t), env.backend_threads()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "idle_clients.py")
    p = subprocess.Popen([sys.executable, script, "127.0.0.1", str(t.port), "sbtest", "sbtest", "sbtest", str(cell.idle), "64"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("held"):
        p.kill()
        raise RuntimeError(f"idle clients on {target}: {line.strip()}")
    # Idle multiplexed sessions park after one to two seconds, and the heap is trimmed every two.
    time.sleep(5)
    rss1, threads1 = env.rss(t), env.backend_threads()
    p.stdin.close()
    p.wait(120)
    figures = {"clients": float(cell.idle), "kb_per_idle_client": (rss1 - rss0) / cell.idle}
    if threads0 is not None and threads1 is not None:
        figures["backend_threads"] = float(threads1)
        figures["backend_threads_added"] = float(threads1 - threads0)
    return figures


def drain_time(env, cell, target):
    """Opens cell.drain idle sessions (half land on each address), drains one address and times
    until none is left there (bench/drain_time.py)."""
    t = env.targets[target]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "drain_time.py")
    out = subprocess.run([sys.executable, script, "127.0.0.1", str(t.port), str(t.admin_port), "tcp", str(cell.drain)],
                         capture_output=True, text=True, timeout=600)
    m = re.search(r"drained (\d+) sessions in ([\d.]+) seconds", out.stdout)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"drain on {target}: {out.stdout}{out.stderr}")
    return {"moved": float(m.group(1)), "drain_seconds": float(m.group(2))}


def connection_cost(env, cell, target, args):
    """Churns connections alone for --duration seconds: CPU µs per connection of the proxy, the
    MariaDB server and the client."""
    t = env.targets[target]
    cpu = lambda pid: env.cpu_seconds(pid) if pid else 0.0  # noqa: E731
    server_pid = getattr(t, "server_pid", None) or env.server_pid
    proxy0, server0 = cpu(t.pid), cpu(server_pid)
    p = subprocess.Popen([str(env.conns_bin), "churn", f"127.0.0.1:{t.port}", "sbtest", "sbtest",
                          str(cell.churn), str(args.duration)], stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    m = re.search(r"churned (\d+) connections.*?(\d+) failed", out)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"churn failed on {target}: {out}")
    n = max(int(m.group(1)) - int(m.group(2)), 1)
    figures = {"conns": float(n), "server_us_per_conn": 1e6 * (cpu(server_pid) - server0) / n,
               "client_us_per_conn": 1e6 * (usage.ru_utime + usage.ru_stime) / n}
    if t.pid:
        figures["proxy_us_per_conn"] = 1e6 * (cpu(t.pid) - proxy0) / n
    return figures


def measure(env, cell, target, args):
    """Runs one cell on one target and returns its figures."""
    if cell.idle:
        return idle_clients(env, cell, target)
    if cell.drain:
        return drain_time(env, cell, target)
    if cell.workload is None:
        return connection_cost(env, cell, target, args)
    if cell.loss:
        return failover.measure(env, cell, target, args)
    if cell.capture:
        return capture_cost.measure(env, cell, target, args, admin, lambda t, d: replay_rate(env, d))
    t = env.targets[target]
    sampled = {}
    if cell.sample:
        rss0 = env.rss(t)

        def sample():
            time.sleep(args.duration / 2)
            sampled["backend_threads"] = env.backend_threads()
            sampled["kb_per_client"] = (env.rss(t) - rss0) / cell.threads if t.pid else None

        sampler = threading.Thread(target=sample)
        sampler.start()
    companion = None
    rss_before = env.rss(t)
    if cell.hold:
        companion = subprocess.Popen([str(env.conns_bin), "hold", f"127.0.0.1:{t.port}", "sbtest", "sbtest", str(cell.hold)],
                                     stdout=subprocess.PIPE, text=True)
        line = companion.stdout.readline()
        if not line.startswith("held"):
            raise RuntimeError(f"could not hold {cell.hold} connections on {target}")
        time.sleep(1)
    rss_held = env.rss(t)
    if cell.churn:
        companion = subprocess.Popen([str(env.conns_bin), "churn", f"127.0.0.1:{t.port}", "sbtest", "sbtest",
                                      str(cell.churn), str(args.duration + 2)], stdout=subprocess.PIPE, text=True)
    extra = list(cell.extra) + ([] if cell.ps else ["--db-ps-mode=disable"])
    figures = env.sysbench(t, cell.workload, cell.threads, args.duration, extra, unix=cell.unix)
    if companion:
        if cell.churn:
            out, _ = companion.communicate(timeout=args.duration + 60)
            figures["churn_report"] = out.strip()
        else:
            companion.kill()
            companion.wait()
    if cell.hold and t.pid:
        figures["rss_per_idle_conn_kb"] = (rss_held - rss_before) / cell.hold
    if cell.sample:
        sampler.join()
        figures.update({k: float(v) for k, v in sampled.items() if v is not None})
    return figures
