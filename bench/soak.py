#!/usr/bin/env python3
"""sluice soak harness (make soak; not run in CI).

Runs sysbench oltp_read_write through sluice (two local MariaDB backends, least-connections) for
--duration seconds. Every --restart-every seconds one backend is restarted on the same port and
data directory: db1, db2, db1, db2, ... killed with `kill -9` for the first pair, stopped with
SIGTERM for the next pair, and so on. Every --sample-every seconds it samples sluice's RSS and
open descriptors (/proc) and its admin API (sessions, backend states). Results go to
bench/results/<name>/: samples.json (raw), report.md (restarts, sysbench totals, a computed
flatness verdict) and soak.png. Exit status 0 means the run completed, whatever the verdict.

    python3 bench/soak.py                                   # 30 minutes (make soak)
    python3 bench/soak.py --duration 120 --restart-every 30 --name soak-try
    make soak SOAK_ARGS="--duration 3600 --threads 16 --auth passthrough"

Provisioning is bench.py's: apt packages via scripts/setup.sh, the sluice-mariadb helper for the
backends, sbtest tables prepared directly on each backend, a release build of sluice, matplotlib.
Scratch files and logs (sluice.log, sysbench.err) are in bench/work/soak/.
"""

import argparse, collections, ctypes, json, os, platform, re, shutil, signal, socket  # noqa: E401
import statistics, subprocess, sys, threading, time, urllib.request  # noqa: E401
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # no bench/__pycache__ from importing bench.py
import report  # noqa: E402
from bench import ROOT, free_ports, prepare_tables, proc_rss_kb, sockets_by_port, wait_port  # noqa: E402

WORK = ROOT / "bench" / "work" / "soak"
INTERVAL_RE = re.compile(r"\[ (\d+)s \] thds: \d+ tps: ([\d.]+) qps: ([\d.]+).*err/s: ([\d.]+) reconn/s: ([\d.]+)")
FD_HANDFUL = 5  # "flat" allows the median descriptor count to grow by at most this many
DRAIN_SECONDS = 15  # after sysbench ends, how long sessions may take to go back to zero
PRCTL = ctypes.CDLL(None).prctl
# sysbench 1.0.20 reconnects by calling mysql_real_connect() on a handle it has just passed to
# mysql_close(); with libmariadb (Debian's build) that segfaults, even against MariaDB directly
# (akopytov/sysbench#527). The LD_PRELOAD shim scripts/sysbench-reconnect-shim.c runs
# mysql_init() on such a handle first.
RECONNECT_SHIM = ROOT / "scripts" / "sysbench-reconnect-shim.c"


def log(msg):
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when the spawning thread (always the main one) dies."""
    PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def terminate(p, timeout):
    if p and p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def poll(cond, timeout, what, watch=None):
    deadline, last = time.time() + timeout, 0.0
    while time.time() < deadline:
        if cond():
            return
        if watch and time.time() - last > 0.25:
            watch()
            last = time.time()
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


class Backend:
    """One mariadbd started by the sluice-mariadb helper; we restart it with the same argv."""

    def __init__(self, name, port, pid):
        self.name, self.port, self.pid, self.proc = name, port, pid, None
        self.argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        self.socket = next(a.split(b"=", 1)[1].decode() for a in self.argv if a.startswith(b"--socket="))

    def alive(self):
        if self.proc:
            return self.proc.poll() is None
        try:  # the helper never reaps its children: a dead one stays a zombie
            return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
        except FileNotFoundError:
            return False

    def greets(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                head = s.recv(5, socket.MSG_WAITALL)
                return len(head) == 5 and head[4] == 10
        except OSError:
            return False

    def start(self):
        Path(self.socket).unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.pid = self.proc.pid


class Soak:
    def __init__(self, args):
        self.args, self.procs, self.backends = args, [], []
        self.samples, self.intervals, self.restarts, self.sysbench_out = [], [], [], []
        self.t0, self.failure = time.time(), None

    def spawn(self, argv, log_name, stdout=subprocess.DEVNULL, **env):
        p = subprocess.Popen(argv, stdout=stdout, stderr=open(WORK / log_name, "w"), text=True,
                             preexec_fn=die_with_parent, env=dict(os.environ, RUST_LOG="info", **env))
        self.procs.append(p)
        return p

    def start_backends(self):
        helper = self.spawn([str(ROOT / "target/release/sluice-mariadb"), "--count", "2", "--dir", str(WORK / "mariadb")],
                            "mariadb.log", stdout=subprocess.PIPE)
        lines = [helper.stdout.readline().strip() for _ in range(2)]
        if not all(lines):
            raise RuntimeError("sluice-mariadb failed; see bench/work/soak/mariadb.log")
        ports = [int(x.rsplit(":", 1)[1]) for x in lines]
        by_port = {}
        for t in Path(f"/proc/{helper.pid}/task").iterdir():
            for pid in map(int, (t / "children").read_text().split()):
                by_port[int(re.search(rb"--port=(\d+)", Path(f"/proc/{pid}/cmdline").read_bytes()).group(1))] = pid
        self.backends = [Backend(f"db{i + 1}", p, by_port[p]) for i, p in enumerate(ports)]
        socks = sockets_by_port(WORK / "mariadb")
        for b in self.backends:
            prepare_tables(SimpleNamespace(args=self.args), b.port, socks[b.port], log_as=b.name)

    def start_sluice(self):
        self.port, self.admin_port = free_ports(2)
        cfg = ['[proxy]\nbalance = "least-connections"\n',
               f'[[listeners]]\naddress = "127.0.0.1:{self.port}"\nauth = "{self.args.auth}"\n',
               *(f'[[backends]]\naddress = "127.0.0.1:{b.port}"\nname = "{b.name}"\n' for b in self.backends),
               '[health]\ninterval = "1s"\ntimeout = "1s"\n', f'[admin]\nlisten = "127.0.0.1:{self.admin_port}"\n']
        if self.args.auth == "users":
            cfg.append('[[users]]\nname = "app"\npassword = "apppw"\n')
        (WORK / "sluice.toml").write_text("\n".join(cfg))
        self.sluice = self.spawn([str(ROOT / "target/release/sluice"), "--config", str(WORK / "sluice.toml")], "sluice.log")
        wait_port(self.admin_port, self.sluice)  # the client listener is bound before the admin one
        poll(lambda: all(b["up"] for b in self.admin("/backends") or [{"up": False}]), 30, "both backends up in sluice")

    def admin(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def sample(self, phase):
        pid = self.sluice.pid
        s = {"t": round(time.time() - self.t0, 2), "phase": phase, "rss_kb": proc_rss_kb(pid),
             "fds": len(os.listdir(f"/proc/{pid}/fd"))}
        sessions, backends = self.admin("/sessions"), self.admin("/backends")
        s["sessions"] = None if sessions is None else len(sessions)
        s["backends"] = {b["name"]: {"up": b["up"], "sessions": b["sessions"]} for b in backends or []}
        s["qps"] = self.intervals[-1]["qps"] if self.intervals else None
        self.samples.append(s)
        return s

    def sampler(self, stop):
        while not stop.is_set() and self.sluice.poll() is None:
            self.sample("run")
            stop.wait(self.args.sample_every)

    def read_sysbench(self, sb):
        for line in sb.stdout:
            self.sysbench_out.append(line)
            if m := INTERVAL_RE.search(line):
                self.intervals.append(dict(zip(("t", "tps", "qps", "err_s", "reconn_s"), map(float, m.groups()))))

    def restart(self, b, kind):
        """One restart; downtime runs from the signal until the server greets again."""
        seen_down = False

        def watch():
            nonlocal seen_down
            up = {x["name"]: x["up"] for x in self.admin("/backends") or []}.get(b.name)
            seen_down |= up is False
            return up is True

        t = time.time()
        os.kill(b.pid, signal.SIGKILL if kind == "kill -9" else signal.SIGTERM)
        poll(lambda: not b.alive(), 90, f"{b.name} to exit", watch)
        stopped = time.time()
        b.start()
        poll(b.greets, 90, f"{b.name} to accept connections again", watch)
        back = time.time()
        poll(watch, 60, f"sluice to see {b.name} up again")
        ev = {"t": round(t - self.t0, 1), "backend": b.name, "kind": kind, "stop_s": round(stopped - t, 2),
              "downtime_s": round(back - t, 2), "sluice_saw_down": seen_down, "up_in_sluice_s": round(time.time() - t, 2)}
        self.restarts.append(ev)
        log(f"restart {len(self.restarts)} at {ev['t']} s: {b.name} {kind}, down {ev['downtime_s']} s, "
            f"up in sluice after {ev['up_in_sluice_s']} s (sluice saw it down: {seen_down})")

    def check_sluice(self):
        if self.sluice.poll() is not None:
            raise RuntimeError(f"sluice exited with {self.sluice.returncode}; see bench/work/soak/sluice.log")

    def run(self):
        a = self.args
        cmd = ["sysbench", "oltp_read_write", "--db-driver=mysql", "--mysql-user=app", "--mysql-password=apppw",
               "--mysql-db=sbtest", "--mysql-host=127.0.0.1", f"--mysql-port={self.port}", f"--tables={a.tables}",
               f"--table-size={a.table_size}", f"--threads={a.threads}", f"--time={a.duration}",
               "--report-interval=10", "--mysql-ignore-errors=all", "run"]
        self.t0 = time.time()
        sb = self.spawn(["stdbuf", "-oL", *cmd], "sysbench.err", stdout=subprocess.PIPE,
                        LD_PRELOAD=str(WORK / "reconnect-shim.so"))
        stop = threading.Event()
        reader = threading.Thread(target=self.read_sysbench, args=(sb,), daemon=True)
        sampler = threading.Thread(target=self.sampler, args=(stop,), daemon=True)
        reader.start()
        sampler.start()
        try:
            for k in range(1, (a.duration - 1) // a.restart_every + 1):
                try:
                    sb.wait(max(0.0, self.t0 + k * a.restart_every - time.time()))
                    break  # sysbench ended early
                except subprocess.TimeoutExpired:
                    pass
                self.check_sluice()
                self.restart(self.backends[(k - 1) % 2], "kill -9" if (k - 1) // 2 % 2 == 0 else "SIGTERM")
            sb.wait(max(0.0, self.t0 + a.duration - time.time()) + 120)
        finally:
            stop.set()
            sampler.join(10)
        reader.join(10)
        self.check_sluice()
        end = time.time()  # once sysbench has gone, sessions should go back to zero
        while True:
            s = self.sample("drain")
            idle = s["sessions"] == 0 and all(b["sessions"] == 0 for b in s["backends"].values())
            if idle or time.time() - end > DRAIN_SECONDS:
                break
            time.sleep(0.5)
        self.drain = {"idle": idle, "after_s": round(time.time() - end, 1), "last": s}
        text, self.totals = "".join(self.sysbench_out), {"exit": sb.returncode}
        for key in ("queries", "transactions", "ignored errors", "reconnects"):
            if m := re.search(rf"{key}:\s+(\d+)\s+\(([\d.]+) per sec", text):
                self.totals[key], self.totals[key + "/s"] = int(m.group(1)), float(m.group(2))
        if sb.returncode != 0 or "queries" not in self.totals:
            tail = (WORK / "sysbench.err").read_text()[-2000:] or text[-2000:]
            self.failure = f"sysbench failed (exit {sb.returncode}): {tail}"

    def stop(self):
        for p in reversed(self.procs):  # sysbench, sluice, the helper (its servers die with it)
            terminate(p, 40)
        for b in self.backends:  # the servers we restarted
            terminate(b.proc, 60)


def verdict(samples, warmup):
    run = [s for s in samples if s["phase"] == "run" and s["t"] >= warmup]
    if len(run) < 2:
        return None
    n = max(1, len(run) // 10)
    first, last = run[:n], run[-n:]
    v = {"warmup_s": warmup, "window_samples": n, "first_t": [first[0]["t"], first[-1]["t"]], "last_t": [last[0]["t"], last[-1]["t"]]}
    for key in ("rss_kb", "fds"):
        v[key] = [statistics.median(s[key] for s in w) for w in (first, last)]
    v["rss_growth_kb"] = v["rss_kb"][1] - v["rss_kb"][0]
    v["rss_growth_pct"] = 100.0 * v["rss_growth_kb"] / v["rss_kb"][0]
    v["fds_growth"] = v["fds"][1] - v["fds"][0]
    v["flat"] = v["rss_growth_pct"] < 5.0 and v["fds_growth"] <= FD_HANDFUL
    return v


def sluice_log_summary(path, limit=12):
    counts = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"\S+\s+(WARN|ERROR|INFO)\s+(\S+): (.*?)(?= \w+=|$)", line)
        if m and m.group(3) not in ("sluice ready", "SIGTERM: draining", "shutdown complete"):
            counts[f"{m.group(1)} {m.group(2)}: {m.group(3)}"] += 1
    return [f"| {n} | {msg} |" for msg, n in counts.most_common(limit)]


def built_commit():
    """The commit the release binary was just built from, and how many files under crates/ differed."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("describe", "--always", "--dirty"), len(git("status", "--porcelain", "--", "crates", "Cargo.lock").splitlines())


def write_report(soak, out, argv):
    a, t, d = soak.args, soak.totals, soak.drain
    v = verdict(soak.samples, min(60, a.duration // 2))
    commit, dirty = soak.commit
    (out / "samples.json").write_text(json.dumps({"args": vars(a), "restarts": soak.restarts, "totals": t, "drain": d,
                                                  "verdict": v, "samples": soak.samples, "sysbench_intervals": soak.intervals}, indent=1))
    L = ["# sluice soak", "", f"`{argv}`", "",
         f"- {a.duration} s of sysbench oltp_read_write, {a.threads} threads, {a.tables} tables of {a.table_size} rows; "
         f"a backend restart every {a.restart_every} s; a sample every {a.sample_every} s; auth {a.auth}",
         f"- machine: {os.cpu_count()} cores, kernel {platform.release()}",
         f"- sluice commit {commit}" + (f" with uncommitted changes in {dirty} file(s) under crates/" if dirty else "")
         + "; release build, two backends, least-connections, health interval 1 s", "",
         "## Restarts", "", "Downtime: from the signal until the server greets again.", "",
         "| # | t (s) | backend | kind | process gone after (s) | downtime (s) | sluice saw it down | up in sluice after (s) |",
         "|---|---|---|---|---|---|---|---|"]
    L += [f"| {i} | {e['t']} | {e['backend']} | {e['kind']} | {e['stop_s']} | {e['downtime_s']} | "
          f"{'yes' if e['sluice_saw_down'] else 'no'} | {e['up_in_sluice_s']} |" for i, e in enumerate(soak.restarts, 1)]
    L += ["", "## sysbench totals", "", f"Exit status {t['exit']}. sysbench runs with an LD_PRELOAD shim (see soak.py) "
          "without which sysbench 1.0.20 + libmariadb crashes when it reconnects (akopytov/sysbench#527).", "",
          "| queries | QPS | transactions | TPS | ignored errors | reconnects |", "|---|---|---|---|---|---|",
          "| " + " | ".join(str(t.get(k, "-")) for k in ("queries", "queries/s", "transactions", "transactions/s",
                                                         "ignored errors", "reconnects")) + " |", "",
          "## sluice over time", "", "| t (s) | RSS MB | fds | sessions | sessions per backend |", "|---|---|---|---|---|"]
    run = [s for s in soak.samples if s["phase"] == "run"]
    marks = {id(s): s for s in [min(run, key=lambda s: abs(s["t"] - m)) for m in range(0, int(run[-1]["t"]), 300)] + [run[-1]]}
    for s in sorted(marks.values(), key=lambda s: s["t"]) + [d["last"]]:
        per = ", ".join(f"{n}: {b['sessions']}{'' if b['up'] else ' (down)'}" for n, b in s["backends"].items())
        label = f"{s['t']} (after sysbench)" if s["phase"] == "drain" else s["t"]
        L.append(f"| {label} | {s['rss_kb'] / 1024:.1f} | {s['fds']} | {s['sessions']} | {per} |")
    L += ["", (f"After sysbench exited, sessions were back to 0 within {d['after_s']} s." if d["idle"] else
               f"After sysbench exited, sessions were NOT back to 0 within {d['after_s']} s: {d['last']['sessions']} left."),
          "", "## Flatness", ""]
    if v is None:
        L.append("Too few samples after the warm-up for a verdict.")
    else:
        L += [f"Medians of the first and of the last 10% of the samples after a {v['warmup_s']} s warm-up "
              f"({v['window_samples']} sample(s) each: t {v['first_t'][0]}-{v['first_t'][1]} s and {v['last_t'][0]}-{v['last_t'][1]} s). "
              f"**flat** means RSS grew by less than 5% and the descriptor count by at most {FD_HANDFUL}; otherwise **growing**.", "",
              f"- RSS: {v['rss_kb'][0]:.0f} KB -> {v['rss_kb'][1]:.0f} KB ({v['rss_growth_kb']:+.0f} KB, {v['rss_growth_pct']:+.1f}%)",
              f"- fds: {v['fds'][0]:.0f} -> {v['fds'][1]:.0f} ({v['fds_growth']:+.0f})", "",
              f"Verdict: **{'flat' if v['flat'] else 'growing'}**"]
    L += ["", "## sluice log (RUST_LOG=info) by message", "", "| count | level target: message |", "|---|---|"]
    L += sluice_log_summary(WORK / "sluice.log") or ["| 0 | (nothing besides start and stop) |"]
    (out / "report.md").write_text("\n".join(L) + "\n")
    chart(soak, out / "soak.png")
    return v


def chart(soak, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    S, t = soak.samples, [s["t"] for s in soak.samples]
    fig, ax = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    ax[0].plot(t, [s["rss_kb"] / 1024 for s in S], color="tab:blue")
    ax[0].set_ylabel("RSS MB", color="tab:blue")
    fd = ax[0].twinx()
    fd.plot(t, [s["fds"] for s in S], color="tab:green")
    fd.set_ylabel("open fds", color="tab:green")
    fd.set_ylim(bottom=0)
    ax[1].step(t, [s["sessions"] for s in S], where="post", label="sessions", color="black", lw=4, alpha=0.3)
    for name in S[0]["backends"]:
        ax[1].step(t, [s["backends"].get(name, {}).get("sessions") for s in S], where="post", label=f"{name} sessions")
    ax[1].set_ylim(0, soak.args.threads * 1.4 + 1)
    ax[1].set_ylabel("sessions")
    ax[1].legend(loc="upper center", ncol=3, fontsize=8)
    ax[2].plot([i["t"] for i in soak.intervals], [i["qps"] for i in soak.intervals], color="tab:purple", marker=".")
    ax[2].set_ylabel("sysbench QPS (10 s)")
    ax[2].set_xlabel("seconds since sysbench started (the last sample is taken after it exited)")
    for x in ax:
        x.set_ylim(bottom=0)
        for e in soak.restarts:
            x.axvline(e["t"], color="red" if e["kind"] == "kill -9" else "orange", ls="--", lw=1)
    ax[0].set_title("sluice soak; backend restarts dashed (red: kill -9, orange: SIGTERM)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=int, default=1800, help="seconds of sysbench")
    p.add_argument("--restart-every", type=int, default=120, help="seconds between backend restarts")
    p.add_argument("--threads", type=int, default=8, help="sysbench threads")
    p.add_argument("--sample-every", type=float, default=5, help="seconds between samples of sluice")
    p.add_argument("--table-size", type=int, default=10000)
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--auth", choices=["users", "passthrough"], default="users", help="sluice's listener auth mode")
    p.add_argument("--name", default="soak", help="results directory under bench/results")
    return p.parse_args()


def main():
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up (finally) on SIGTERM too
    subprocess.run([str(ROOT / "scripts/setup.sh"), "sysbench", "gcc", "libc6-dev"], check=True)
    report.ensure_matplotlib()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice", "-p", "sluice-testkit", "--bins"], cwd=ROOT, check=True)
    WORK.mkdir(parents=True, exist_ok=True)
    for p in WORK.iterdir():  # mariadb/ keeps the helper's template data directory across runs
        if p.name != "mariadb":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(WORK / "reconnect-shim.so"), str(RECONNECT_SHIM),
                    "-ldl"], check=True)
    soak = Soak(args)
    soak.commit = built_commit()
    try:
        soak.start_backends()
        soak.start_sluice()
        log(f"sluice on port {soak.port} (admin {soak.admin_port}), backends on {[b.port for b in soak.backends]}; "
            f"sysbench for {args.duration} s")
        soak.run()
        out = ROOT / "bench" / "results" / args.name
        out.mkdir(parents=True, exist_ok=True)
        v, t = write_report(soak, out, " ".join(sys.argv)), soak.totals
        log(f"{t.get('queries')} queries ({t.get('queries/s')}/s), {t.get('ignored errors')} ignored errors, "
            f"{t.get('reconnects')} reconnects, {len(soak.restarts)} restarts; "
            + (f"RSS {v['rss_growth_kb']:+.0f} KB ({v['rss_growth_pct']:+.1f}%), fds {v['fds_growth']:+.0f}: "
               f"{'flat' if v['flat'] else 'growing'}" if v else "no verdict"))
        log(f"report: {out / 'report.md'}")
        if soak.failure:
            raise SystemExit(soak.failure)
    finally:
        soak.stop()
        for d in (WORK / "mariadb").glob("db-*"):
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
