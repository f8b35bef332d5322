"""The benchmark report: Markdown tables laid out like the seed reports, ratios against HAProxy,
the targets of the benchmark issue, and PNG charts."""

import os
import statistics
import subprocess
import sys

import failover
import tidb


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)


def f(v, digits=0):
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def get(med, key, field):
    c = med.get(key)
    return None if c is None else c.get(field)


def basic(med, args, lines):
    for w in args.workloads:
        lines += [f"### {w}", "",
                  "| threads | direct QPS | HAProxy QPS | sluice QPS | sluice/HAProxy QPS | HAProxy avg/p95 ms | sluice avg/p95 ms "
                  "| HAProxy CPU % | sluice CPU % | HAProxy µs/query | sluice µs/query | sluice/HAProxy CPU per query |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for t in args.threads:
            k = lambda target: f"basic/{w}/{t}/{target}"  # noqa: E731
            row = [str(t)] + [f(get(med, k(x), "qps")) for x in ("direct", "haproxy", "sluice")]
            row.append(f(ratio(get(med, k("sluice"), "qps"), get(med, k("haproxy"), "qps")), 2))
            for x in ("haproxy", "sluice"):
                row.append(f"{f(get(med, k(x), 'avg_ms'), 2)} / {f(get(med, k(x), 'p95_ms'), 2)}")
            row += [f(get(med, k(x), "proxy_cpu_pct")) for x in ("haproxy", "sluice")]
            row += [f(get(med, k(x), "proxy_cpu_us_per_query"), 1) for x in ("haproxy", "sluice")]
            row.append(f(ratio(get(med, k("sluice"), "proxy_cpu_us_per_query"), get(med, k("haproxy"), "proxy_cpu_us_per_query")), 2))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    cpu_split(med, args, lines)


def cpu_split(med, args, lines):
    """Where the proxies' CPU per query goes: user space (the proxy's own code) and the kernel
    (system calls, the loopback TCP path, waking the peer), from utime and stime."""
    lines += ["### Proxy CPU per query: user space and kernel", "",
              "utime and stime of the proxy process (tick-sampled, so read them as a split of the total above). "
              "The kernel part is the system calls and the loopback TCP path both proxies share.", "",
              "| workload | threads | HAProxy user µs | HAProxy kernel µs | sluice user µs | sluice kernel µs "
              "| HAProxy kernel share | sluice/HAProxy user | sluice/HAProxy kernel |",
              "|---|---|---|---|---|---|---|---|---|"]
    for w in args.workloads:
        for t in args.threads:
            k = lambda target: f"basic/{w}/{t}/{target}"  # noqa: E731
            hu, hk = get(med, k("haproxy"), "proxy_user_us_per_query"), get(med, k("haproxy"), "proxy_kernel_us_per_query")
            su, sk = get(med, k("sluice"), "proxy_user_us_per_query"), get(med, k("sluice"), "proxy_kernel_us_per_query")
            share = ratio(hk, None if hu is None or hk is None else hu + hk)
            row = [w, str(t), f(hu, 2), f(hk, 2), f(su, 2), f(sk, 2), f(share, 2), f(ratio(su, hu), 2), f(ratio(sk, hk), 2)]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")


def ranges(med, args, lines):
    lines += [f"Simple ranges only, no transactions, {args.range_threads} threads.", "",
              "| rows per query | direct QPS | HAProxy QPS | sluice QPS | HAProxy µs/query | sluice µs/query | sluice/HAProxy CPU per query |",
              "|---|---|---|---|---|---|---|"]
    for size in args.range_sizes:
        k = lambda target: f"ranges/{size}/{target}"  # noqa: E731
        row = [str(size)] + [f(get(med, k(x), "qps")) for x in ("direct", "haproxy", "sluice")]
        row += [f(get(med, k(x), "proxy_cpu_us_per_query"), 1) for x in ("haproxy", "sluice")]
        row.append(f(ratio(get(med, k("sluice"), "proxy_cpu_us_per_query"), get(med, k("haproxy"), "proxy_cpu_us_per_query")), 2))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")


def latency_us(med, variant, target):
    qps = get(med, f"latency/{variant}/{target}", "qps")
    return None if not qps else 1e6 / qps


def latency(med, args, lines):
    lines += ["One client thread, oltp_point_select; latency per query = 1 / QPS.", "",
              "| transport | direct µs | HAProxy µs | sluice µs | HAProxy added µs | sluice added µs |",
              "|---|---|---|---|---|---|"]
    for v in ("tcp", "unix"):
        d, h, s = (latency_us(med, v, x) for x in ("direct", "haproxy", "sluice"))
        added = lambda x: None if x is None or d is None else x - d  # noqa: E731
        lines.append(f"| {v} | {f(d, 1)} | {f(h, 1)} | {f(s, 1)} | {f(added(h), 1)} | {f(added(s), 1)} |")
    lines.append("")


def with_and_without(med, suite, level, intro, extra_col, lines):
    """QPS of each proxy without and with a companion load (idle or churning connections)."""
    header = "| proxy | QPS without | QPS with | change |" + (f" {extra_col[0]} |" if extra_col else "")
    lines += [intro, "", header, "|---|---|---|---|" + ("---|" if extra_col else "")]
    for x in ("haproxy", "sluice"):
        a, b = get(med, f"{suite}/0/{x}", "qps"), get(med, f"{suite}/{level}/{x}", "qps")
        ch = ratio(b, a)
        row = f"| {x} | {f(a)} | {f(b)} | {f(None if ch is None else 100 * (ch - 1), 1)}% |"
        if extra_col:
            row += f" {f(get(med, f'{suite}/{level}/{x}', extra_col[1]), 1)} |"
        lines.append(row)
    lines.append("")


def long_conns(med, args, lines):
    intro = (f"{args.idle_conns} idle authenticated connections held open while sysbench runs ({args.long_threads} threads). "
             "KB per idle connection is the largest of the rounds: a proxy that keeps freed memory for reuse shows no "
             "growth in the rounds after the first.")
    with_and_without(med, "long", args.idle_conns, intro, ("KB of proxy RSS per idle connection", "rss_per_idle_conn_kb"), lines)


def short_conns(med, args, lines):
    intro = f"A background client opens and closes {args.churn_rate} connections per second while sysbench runs."
    with_and_without(med, "short", args.churn_rate, intro, None, lines)
    lines += [f"What one new connection (log in, quit) costs, churning {args.churn_rate}/s with nothing else running, "
              "in CPU µs per connection:", "",
              "| target | proxy | MariaDB server | client | all three |", "|---|---|---|---|---|"]
    for x in ("direct", "haproxy", "sluice"):
        k = f"short/cost/{x}"
        parts = [get(med, k, "proxy_us_per_conn"), get(med, k, "server_us_per_conn"), get(med, k, "client_us_per_conn")]
        total = None if parts[1] is None else sum(v for v in parts if v is not None)
        lines.append(f"| {x} | {f(parts[0], 1) if parts[0] is not None else '-'} | {f(parts[1], 1)} | {f(parts[2], 1)} | {f(total, 1)} |")
    lines.append("")


def multiplex(med, args, lines):
    cap = getattr(args, "mux_cap", 32)
    lines += [f"Many clients, few backend connections: sysbench with this many client connections directly to "
              f"MariaDB, through HAProxy (one backend connection per client) and through sluice in users mode with "
              f"`multiplex = true` and `max_backend_connections = {cap}`. Backend connections (MariaDB's "
              "Threads_connected, health checks included) and proxy memory per client are sampled halfway "
              "through the run. CPU per query of each process on the machine: the proxy, the MariaDB server (where "
              "it was measured) and sysbench (the client); all three share its cores, so the total sets the QPS.", "",
              "| workload | clients | target | QPS | vs direct | vs HAProxy | p95 ms | errors | backend connections "
              "| proxy µs/query | server µs/query | client µs/query | total µs/query | proxy KB per client |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in args.workloads[:2]:
        for c in getattr(args, "mux_clients", []):
            base = f"multiplex/{w}/{c}"
            direct, haproxy = get(med, f"{base}/direct", "qps"), get(med, f"{base}/haproxy", "qps")
            for x in ("direct", "haproxy", "sluice-mux"):
                k = f"{base}/{x}"
                if k not in med:
                    continue
                q = get(med, k, "qps")
                lines.append(f"| {w} | {c} | {x} | {f(q)} | {f(ratio(q, direct), 2)} | {f(ratio(q, haproxy), 2)} "
                             f"| {f(get(med, k, 'p95_ms'), 2)} | {f(get(med, k, 'errors'))} | {f(get(med, k, 'backend_threads'))} "
                             f"| {f(get(med, k, 'proxy_cpu_us_per_query'), 1)} | {f(get(med, k, 'server_cpu_us_per_query'), 1)} "
                             f"| {f(client_us(med, k), 1)} | {f(total_us(med, k), 1)} | {f(get(med, k, 'kb_per_client'), 2)} |")
    lines.append("")


def client_us(med, k):
    """sysbench's CPU per query (µs) in cell `k`."""
    pct, qps = get(med, k, "client_cpu_pct"), get(med, k, "qps")
    return None if pct is None or not qps else 1e4 * pct / qps


def total_us(med, k):
    """The CPU per query of the proxy, the server and the client together (None: one is unknown)."""
    server, client = get(med, k, "server_cpu_us_per_query"), client_us(med, k)
    if server is None or client is None:
        return None
    return server + client + (get(med, k, "proxy_cpu_us_per_query") or 0.0)


def split(med, args, lines):
    lines += ["A primary and two GTID replicas (the seed's ProxySQL/MaxScale topology on this machine): sysbench "
              "directly to one replica (`split-direct`), through HAProxy spreading over both replicas "
              "(`split-haproxy`, leastconn) and through sluice with `[routing] split = true` in users mode "
              "(`sluice-split`: every statement classified, reads to a replica fit for reads, each connection "
              "brought to the session's state). oltp_read_only runs with --skip_trx=on.", "",
              "| workload | transport | threads | target | QPS | vs direct | vs HAProxy | avg/p95 ms | errors "
              "| proxy CPU % | proxy µs/query |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in ("oltp_point_select", "oltp_read_only"):
        for transport in ("tcp", "unix"):
            for t in getattr(args, "split_threads", []):
                base = f"split/{w}/{transport}/{t}"
                direct, haproxy = get(med, f"{base}/split-direct", "qps"), get(med, f"{base}/split-haproxy", "qps")
                for x in ("split-direct", "split-haproxy", "sluice-split"):
                    k = f"{base}/{x}"
                    if k not in med:
                        continue
                    q = get(med, k, "qps")
                    lines.append(f"| {w} | {transport} | {t} | {x} | {f(q)} | {f(ratio(q, direct), 2)} "
                                 f"| {f(ratio(q, haproxy), 2)} | {f(get(med, k, 'avg_ms'), 2)} / {f(get(med, k, 'p95_ms'), 2)} "
                                 f"| {f(get(med, k, 'errors'))} | {f(get(med, k, 'proxy_cpu_pct'))} "
                                 f"| {f(get(med, k, 'proxy_cpu_us_per_query'), 1)} |")
    lines.append("")


def features(med, args, lines):
    lines += ["What digests, 100 regex rules and the split's classifier cost per query, each against sluice without "
              "it, in one run: users mode, TLS off, one server. `feat-bare`: digests and rules off; `feat-digests`: "
              "digests on; `feat-rules100`: 100 `match` rules that no statement matches; `feat-mux`: multiplexing "
              "(a connection taken and given back at every statement); `feat-split`: the split over the one server "
              "as its primary (every statement classified, then run as multiplexing runs it), compared with feat-mux.",
              "", "| workload | threads | target | QPS | proxy µs/query | CPU/query vs its base |",
              "|---|---|---|---|---|---|"]
    for w in args.workloads[:2]:
        for t in args.threads:
            base = f"features/{w}/{t}"
            for x, against in (("feat-bare", None), ("feat-digests", "feat-bare"), ("feat-rules100", "feat-bare"),
                               ("feat-mux", "feat-bare"), ("feat-split", "feat-mux")):
                k = f"{base}/{x}"
                if k not in med:
                    continue
                cpu = get(med, k, "proxy_cpu_us_per_query")
                vs = ratio(cpu, get(med, f"{base}/{against}", "proxy_cpu_us_per_query")) if against else None
                lines.append(f"| {w} | {t} | {x} | {f(get(med, k, 'qps'))} | {f(cpu, 2)} "
                             f"| {f(vs, 3) + ' vs ' + against if vs is not None else ''} |")
    lines.append("")


def capture(med, args, lines):
    if args.capture_phase is None:
        # (A run from before the suite switched capture within one run.)
        lines += ["Traffic capture's cost, as in the TiProxy seed's table: oltp_read_write through sluice (users mode, TLS "
                  "off) with capture off and on, in one run. Min QPS is the lowest one-second sample. The capture's rate "
                  "is what it wrote (zstd) per second of the run; replay plays each capture back against the server, "
                  "as fast as it goes in order (`--speed 1000`): its throughput. (It replays against the server as the "
                  "run left it, so its results are not compared here; tests/replay.rs compares them against a copy.)", ""]
    else:
        lines += capture_method(args)
    lines += ["| threads | capture | QPS | min QPS | p95 ms | proxy CPU % | QPS loss | min QPS loss | MB/s | bytes/command | "
              "dropped | replay commands/s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in args.capture_threads:
        off, on = f"capture/oltp_read_write/{t}/capture-off", f"capture/oltp_read_write/{t}/capture-on"
        for k, label in ((off, "off"), (on, "on")):
            if k not in med:
                continue
            loss = min_loss = None
            if label == "on":
                loss, min_loss = capture_loss(med, off, on, "qps", args), capture_loss(med, off, on, "min_qps", args)
            pct = lambda v: "" if v is None else f"{100 * v:.1f}%"
            lines.append(f"| {t} | {label} | {f(get(med, k, 'qps'))} | {f(get(med, k, 'min_qps'))} | {f(get(med, k, 'p95_ms'), 2)} "
                         f"| {f(get(med, k, 'proxy_cpu_pct'))} | {pct(loss)} | {pct(min_loss)} "
                         f"| {f(get(med, k, 'capture_mb_per_s'), 2) if label == 'on' else ''} "
                         f"| {f(get(med, k, 'capture_bytes_per_command'), 1) if label == 'on' else ''} "
                         f"| {f(get(med, k, 'capture_dropped')) if label == 'on' else ''} "
                         f"| {f(get(med, k, 'replay_commands_per_s')) if label == 'on' else ''} |")
    lines.append("")


def capture_loss(med, off, on, field, args):
    """The share of `field` (qps or min_qps) lost with capture on. In a run that switched capture on
    and off within each round, the median of the rounds' own losses: each round compares its own
    seconds, and the rounds differ from each other by more than capture costs, so off's median and
    on's median may come from different rounds. Else off's median against on's."""
    if args.capture_phase is not None:
        pairs = [(a, b) for a, b in zip(get(med, off, field + "_rounds") or [], get(med, on, field + "_rounds") or [])
                 if a and b is not None]
        if pairs:
            return statistics.median(1 - b / a for a, b in pairs)
    a, b = get(med, off, field), get(med, on, field)
    return None if not a or b is None else 1 - b / a


def capture_method(args):
    return ["Traffic capture's cost, as in the TiProxy seed's table: oltp_read_write through sluice (users mode, TLS "
            f"off). Off and on are not two runs: in one sysbench run of each round, capture is switched on and off "
            f"every {args.capture_phase} s ({args.capture_phases} phases after one of warm-up, the first alternating between "
            "rounds), and "
            "each row is measured over its own seconds, the first second after each switch left out (the host drifts "
            "more from one run to the next than capture costs). QPS is the mean of the one-second samples, min QPS "
            "the lowest, p95 the median of the seconds' p95, proxy CPU over the same seconds; each column is the "
            "median of the rounds, and the losses are the median of each round's own loss (its seconds on against "
            "its seconds off). Each capture starts "
            "with every session open. The capture's rate is what it wrote (zstd) per second captured; replay plays "
            "the run's last capture back against the server, as fast as it goes in order (`--speed 1000`): its "
            "throughput. (It replays against the server as the run left it, so its results are not compared here; "
            "tests/replay.rs compares them against a copy.)", ""]


def idle(med, args, lines):
    n = getattr(args, "idle_clients", 0)
    lines += [f"{n} idle client connections opened by a real driver (PyMySQL, with a schema and its connection "
              "attributes), 64 at a time, and held: the proxy's memory per connection (RSS growth / connections) "
              "and the backend connections they hold (MariaDB's Threads_connected, health checks included). "
              "`sluice` is the default set-up (passthrough), `sluice-mux` users mode with multiplexing; both offer TLS "
              "(a certificate of their own), which PyMySQL takes, while MariaDB, and so HAProxy, offer none here. "
              "`sluice-mux-plain` is `sluice-mux` with `tls = \"off\"`.", "",
              "| target | KB per idle client | backend connections | backend connections added |", "|---|---|---|---|"]
    for x in ("haproxy", "sluice", "sluice-mux", "sluice-mux-plain"):
        k = f"idle/{n}/{x}"
        if k in med:
            lines.append(f"| {x} | {f(get(med, k, 'kb_per_idle_client'), 2)} | {f(get(med, k, 'backend_threads'))} "
                         f"| {f(get(med, k, 'backend_threads_added'))} |")
    lines.append("")


def drain(med, args, lines):
    lines += ["Idle sessions of a real driver (PyMySQL) in users mode, spread over two addresses of the one "
              "server (TCP and its Unix socket); `POST /backends/tcp/drain`, then the time until `/backends` "
              "shows no session left on it (polled every 5 ms). `sluice-2addr` holds a connection per "
              "session (each move logs in on the other address and restores the session there); "
              "`sluice-2addr-mux` multiplexes (a session between statements holds none: a move only "
              "changes its backend).", "",
              "| sessions open | target | moved | drain seconds |", "|---|---|---|---|"]
    for n in getattr(args, "drain_sessions", []):
        for x in ("sluice-2addr", "sluice-2addr-mux"):
            k = f"drain/{n}/{x}"
            if k in med:
                lines.append(f"| {n} | {x} | {f(get(med, k, 'moved'))} | {f(get(med, k, 'drain_seconds'), 3)} |")
    lines.append("")


def scaling(med, args, lines):
    lines += ["In front of the minimal responder, which needs little CPU per query, so that the proxy takes the "
              "largest share of the machine; client-side statements. CPU is "
              f"in % of one core; the machine has {os.cpu_count()} cores, shared by sysbench, the proxy and the "
              "responder, so \"machine\" is how busy all of them were together:", "",
              "| threads | HAProxy QPS | sluice 1 worker QPS | sluice 2 workers QPS | 2 workers / 1 worker "
              "| sluice CPU % 1 / 2 workers | sluice µs/query 1 / 2 workers | sysbench CPU % 1 / 2 workers "
              "| machine busy % 1 / 2 workers |", "|---|---|---|---|---|---|---|---|---|"]
    for t in args.threads:
        k = lambda target: f"scaling/responder/{t}/{target}"  # noqa: E731
        one, two = get(med, k("sluice-1w-resp"), "qps"), get(med, k("sluice-2w-resp"), "qps")
        pair = lambda field, d=0: " / ".join(f(get(med, k(x), field), d) for x in ("sluice-1w-resp", "sluice-2w-resp"))  # noqa: E731
        lines.append(f"| {t} | {f(get(med, k('haproxy-resp'), 'qps'))} | {f(one)} | {f(two)} | {f(ratio(two, one), 2)} "
                     f"| {pair('proxy_cpu_pct')} | {pair('proxy_cpu_us_per_query', 1)} | {pair('client_cpu_pct')} "
                     f"| {pair('machine_busy_pct')} |")
    lines += ["", "In front of MariaDB (the backend shares the machine), sluice with 1 and 2 workers:", "",
              "| threads | 1 worker QPS | 2 workers QPS | 2 workers / 1 worker |", "|---|---|---|---|"]
    for t in args.threads:
        one, two = get(med, f"scaling/mariadb/{t}/sluice-1w", "qps"), get(med, f"scaling/mariadb/{t}/sluice-2w", "qps")
        lines.append(f"| {t} | {f(one)} | {f(two)} | {f(ratio(two, one), 2)} |")
    lines.append("")


FLOOR_TARGETS = [("haproxy", "HAProxy"), ("sluice", "sluice"), ("sluice-pgo", "sluice, PGO build"),
                 ("forward-epoll", "epoll forwarder"),
                 ("forward-uring", "io_uring forwarder"), ("forward-tokio", "tokio forwarder")]


def floor(med, args, lines):
    lines += ["The cells of the CPU targets, also on two forwarders that relay bytes and do nothing else "
              "(`sluice-forward`, one thread each, 64 KiB per direction): a level-triggered epoll loop with one "
              "read per readiness event, an io_uring loop that keeps a receive in flight on every socket "
              "and submits and waits in one system call per turn, and tokio's current-thread runtime as each of "
              "sluice's workers runs it, one task per connection (`copy_bidirectional`). They bound what relaying costs on each "
              "event loop with no protocol work; HAProxy runs with its default 16 KiB buffers.", "",
              "| cell | target | QPS | QPS vs HAProxy | CPU µs/query | user µs | kernel µs | CPU vs HAProxy |",
              "|---|---|---|---|---|---|---|---|"]
    variants = [c.split("/", 1)[1].rsplit("/", 1)[0] for c in med if c.startswith("floor/") and c.endswith("/haproxy")]
    for v in variants:
        k = lambda target: f"floor/{v}/{target}"  # noqa: E731
        for target, label in FLOOR_TARGETS:
            if target == "sluice-pgo" and k(target) not in med:
                continue
            row = [v, label, f(get(med, k(target), "qps")),
                   f(ratio(get(med, k(target), "qps"), get(med, k("haproxy"), "qps")), 2)]
            row += [f(get(med, k(target), x), 2) for x in
                    ("proxy_cpu_us_per_query", "proxy_user_us_per_query", "proxy_kernel_us_per_query")]
            row.append(f(ratio(get(med, k(target), "proxy_cpu_us_per_query"),
                               get(med, k("haproxy"), "proxy_cpu_us_per_query")), 2))
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")


def runtime(med, args, lines):
    lines += [f"sluice with {args.workers} workers: one single-threaded runtime per worker (per-core, the default) "
              "against one work-stealing runtime (multi).", "",
              "| workload | threads | HAProxy QPS | per-core QPS | multi QPS | HAProxy µs/query | per-core µs/query | multi µs/query |",
              "|---|---|---|---|---|---|---|---|"]
    for t in args.threads:
        for w in args.workloads[:2]:
            k = lambda target: f"runtime/{w}/{t}/{target}"  # noqa: E731
            row = [w, str(t)] + [f(get(med, k(x), "qps")) for x in ("haproxy", "sluice", "sluice-multi")]
            row += [f(get(med, k(x), "proxy_cpu_us_per_query"), 1) for x in ("haproxy", "sluice", "sluice-multi")]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")


def targets(med, args, lines):
    def cpu_ratio(key):
        return ratio(get(med, f"{key}/sluice", "proxy_cpu_us_per_query"), get(med, f"{key}/haproxy", "proxy_cpu_us_per_query"))

    def qps_ratio(key):
        return ratio(get(med, f"{key}/sluice", "qps"), get(med, f"{key}/haproxy", "qps"))

    rt = args.range_threads
    rows = [
        ("CPU per query vs HAProxy, point_select 32 threads", cpu_ratio("basic/oltp_point_select/32"), "<=", 0.80,
         floor_why(med, "oltp_point_select/32")),
        ("CPU per query vs HAProxy, read_only 8 threads", cpu_ratio("basic/oltp_read_only/8"), "<=", 0.80,
         floor_why(med, "oltp_read_only/8")),
        ("CPU per query vs HAProxy, 1000-row ranges", cpu_ratio("ranges/1000"), "<=", 0.80, floor_why(med, f"ranges-1000/{rt}")),
    ]
    for w in args.workloads:
        for t in args.threads:
            rows.append((f"QPS vs HAProxy, {w} {t} threads", qps_ratio(f"basic/{w}/{t}"), ">=", 1.10 if w == "oltp_read_only" else 1.0,
                         qps_why(med, f"basic/{w}/{t}")))
    d, s = latency_us(med, "tcp", "direct"), latency_us(med, "tcp", "sluice")
    rows.append(("added latency vs direct, 1 thread TCP (µs)", None if d is None or s is None else s - d, "<=", 15, ""))
    rows.append(("proxy memory per idle client connection (KB)", get(med, f"long/{args.idle_conns}/sluice", "rss_per_idle_conn_kb"), "<=", 3, ""))
    a, b = get(med, "short/0/sluice", "qps"), get(med, f"short/{args.churn_rate}/sluice", "qps")
    rows.append((f"QPS loss with {args.churn_rate} new connections/s (%)", None if not a or b is None else 100 * (1 - b / a), "<=", 2,
                 short_why(med, args), short_rounds(med, args)))
    for t in args.threads:
        one, two = get(med, f"scaling/responder/{t}/sluice-1w-resp", "qps"), get(med, f"scaling/responder/{t}/sluice-2w-resp", "qps")
        rows.append((f"1 -> 2 workers, proxy-bound, {t} threads", ratio(two, one), ">=", 1.9, scaling_why(med, t)))
    rows += mux_targets(med, args) + idle_targets(med, args) + capture_targets(med, args)
    lines += ["A target not met has, next to it, what limits it as measured in this same run (details in the "
              "sections below and in docs/PERFORMANCE.md).", "",
              "| figure | measured | target | met | what limits it, in this run |", "|---|---|---|---|---|"]
    for name, v, op, goal, why, *always in rows:
        met = "-" if v is None else ("yes" if (v <= goal if op == "<=" else v >= goal) else "no")
        note = "; ".join(x for x in [why if met == "no" else ""] + always if x)
        lines.append(f"| {name} | {f(v, 2)} | {op} {goal} | {met} | {note} |")
    lines.append("")


def mux_targets(med, args):
    """Issue 15's throughput targets: at the most clients, multiplexing at or above direct and HAProxy."""
    if "multiplex" not in args.suites or not getattr(args, "mux_clients", None):
        return []
    c, rows = max(args.mux_clients), []
    for w in args.workloads[:2]:
        k = f"multiplex/{w}/{c}"
        q = get(med, f"{k}/sluice-mux", "qps")
        for other, label in (("direct", "direct"), ("haproxy", "HAProxy")):
            rows.append((f"QPS vs {label}, {w} {c} clients, multiplexed", ratio(q, get(med, f"{k}/{other}", "qps")), ">=", 1.0,
                         mux_why(med, k)))
    return rows


def mux_why(med, k):
    """Where the CPU of a multiplexed query goes, against direct's: the machine is shared by all three."""
    busy, proxy = get(med, f"{k}/sluice-mux", "machine_busy_pct"), get(med, f"{k}/sluice-mux", "proxy_cpu_us_per_query")
    if busy is None or proxy is None:
        return ""
    why = f"machine {busy:.0f}% busy of {100 * os.cpu_count()}%; sluice {proxy:.1f} µs of CPU per query"
    direct, through = get(med, f"{k}/direct", "server_cpu_us_per_query"), get(med, f"{k}/sluice-mux", "server_cpu_us_per_query")
    if direct is not None and through is not None:
        why += f"; the server {direct:.1f} µs per query direct, {through:.1f} through sluice"
    direct, through = total_us(med, f"{k}/direct"), total_us(med, f"{k}/sluice-mux")
    if direct is not None and through is not None:
        why += (f"; proxy, server and client together {direct:.1f} µs per query direct, {through:.1f} through sluice "
                f"(sysbench {client_us(med, f'{k}/direct'):.1f} and {client_us(med, f'{k}/sluice-mux'):.1f})")
    return why


def idle_targets(med, args):
    """Issue 15's memory target: an idle multiplexed driver connection at most 2 KB."""
    n = getattr(args, "idle_clients", 0)
    if "idle" not in args.suites or not n:
        return []
    plain = get(med, f"idle/{n}/sluice-mux-plain", "kb_per_idle_client")
    tls_why = "" if plain is None else f"{plain:.2f} KB without TLS in this run: the rest is each connection's TLS state (rustls)"
    return [("proxy memory per idle driver connection, multiplexed, TLS (KB)", get(med, f"idle/{n}/sluice-mux", "kb_per_idle_client"),
             "<=", 2, tls_why),
            ("proxy memory per idle driver connection, multiplexed, plain (KB)",
             get(med, f"idle/{n}/sluice-mux-plain", "kb_per_idle_client"), "<=", 2, "")]


def capture_targets(med, args):
    """Issue 17's targets: capture on costs at most 1% of the average QPS and 2% of the lowest second's."""
    if "capture" not in args.suites:
        return []
    rows = []
    for t in args.capture_threads:
        off, on = f"capture/oltp_read_write/{t}/capture-off", f"capture/oltp_read_write/{t}/capture-on"
        for field, label, goal in (("qps", "average", 1), ("min_qps", "minimum", 2)):
            loss = capture_loss(med, off, on, field, args)
            loss = None if loss is None else 100 * loss
            rows.append((f"{label} QPS loss with capture on, {t} threads (%)", loss, "<=", goal, capture_why(med, off, on, args)))
    return rows


def capture_why(med, off, on, args):
    """How far the capture-off and capture-on cells moved round by round."""
    pairs = [(a, b) for a, b in zip(get(med, off, "qps_rounds") or [], get(med, on, "qps_rounds") or []) if a and b is not None]
    if len(pairs) < 2:
        return ""
    changes = ", ".join(f"{100 * (b / a - 1):+.1f}%".replace("-", "−") for a, b in pairs)
    mins = [(a, b) for a, b in zip(get(med, off, "min_qps_rounds") or [], get(med, on, "min_qps_rounds") or []) if a and b is not None]
    min_changes = ", ".join(f"{100 * (b / a - 1):+.1f}%".replace("-", "−") for a, b in mins)
    cpu = ratio(get(med, on, "proxy_cpu_us_per_query"), get(med, off, "proxy_cpu_us_per_query"))
    others = [(name, ratio(get(med, on, k), get(med, off, k)))
              for name, k in (("MariaDB's", "server_cpu_us_per_query"), ("sysbench's", "sysbench_cpu_us_per_query"))]
    others = "".join(f", {name} {r:.2f}x" for name, r in others if r is not None)
    stalls = (get(med, off, "stalled_seconds"), get(med, on, "stalled_seconds"))
    return (f"QPS change per round {changes}" + (f"; min QPS {min_changes}" if mins else "") + ("" if cpu is None else f"; sluice's CPU per query {cpu:.2f}x with capture{others}")
            + ("; rounds that differ this much cannot resolve 1%" if args.capture_phase is None else "")
            + (f"; seconds under half their round's median QPS, off {stalls[0]:.0f}, on {stalls[1]:.0f}"
               if any(stalls) else ""))


def floor_why(med, cell):
    """The CPU per query of the bare forwarders over HAProxy's in a floor cell."""
    parts = []
    for target, label in (("forward-epoll", "epoll"), ("forward-uring", "io_uring"), ("forward-tokio", "tokio")):
        r = ratio(get(med, f"floor/{cell}/{target}", "proxy_cpu_us_per_query"), get(med, f"floor/{cell}/haproxy", "proxy_cpu_us_per_query"))
        if r is not None:
            parts.append(f"{label} {r:.2f}")
    return f"bare forwarders (no protocol work) cost {', '.join(parts)} of HAProxy's CPU per query" if parts else ""


def qps_why(med, key):
    """A saturated machine: QPS follows the proxy's CPU per query."""
    cpu = ratio(get(med, f"{key}/sluice", "proxy_cpu_us_per_query"), get(med, f"{key}/haproxy", "proxy_cpu_us_per_query"))
    busy = get(med, f"{key}/sluice", "machine_busy_pct")
    if cpu is None or busy is None:
        return ""
    return f"machine {busy:.0f}% busy of {100 * os.cpu_count()}%; sluice's CPU per query {cpu:.2f}x HAProxy's"


def short_why(med, args):
    a, b = get(med, "short/0/haproxy", "qps"), get(med, f"short/{args.churn_rate}/haproxy", "qps")
    cost = lambda x: sum(get(med, f"short/cost/{x}", k) or 0 for k in ("proxy_us_per_conn", "server_us_per_conn", "client_us_per_conn"))  # noqa: E731
    if not a or b is None:
        return ""
    client = get(med, "short/cost/sluice", "client_us_per_conn")
    share = "" if client is None else (f"; the churning client alone takes {client * args.churn_rate / 1e4 / os.cpu_count():.1f}% "
                                       "of the machine's CPU")
    return (f"HAProxy loses {100 * (1 - b / a):.1f}%; a connection costs {cost('sluice'):.0f} µs of CPU through sluice "
            f"and {cost('direct'):.0f} µs direct (proxy, server and client){share}")


def short_rounds(med, args):
    """The QPS change round by round (the two cells of a pair measured one after the other): how far the machine
    drifts between two cells, against a target of a few percent."""
    def changes(proxy):
        without = get(med, f"short/0/{proxy}", "qps_rounds") or []
        with_ = get(med, f"short/{args.churn_rate}/{proxy}", "qps_rounds") or []
        return [100 * (b / a - 1) for a, b in zip(without, with_) if a and b is not None]

    def pct(xs):
        return ", ".join(f"{x:+.1f}%".replace("-", "−") for x in xs)
    s, h = changes("sluice"), changes("haproxy")
    if len(s) < 2:
        return ""
    return (f"QPS change per round: sluice {pct(s)}, HAProxy {pct(h)}; rounds that differ this much cannot resolve "
            f"a loss of a few percent")


def scaling_why(med, t):
    k = lambda target, field: get(med, f"scaling/responder/{t}/{target}", field)  # noqa: E731
    c1, c2 = k("sluice-1w-resp", "proxy_cpu_pct"), k("sluice-2w-resp", "proxy_cpu_pct")
    u1, u2 = k("sluice-1w-resp", "proxy_cpu_us_per_query"), k("sluice-2w-resp", "proxy_cpu_us_per_query")
    busy = k("sluice-2w-resp", "machine_busy_pct")
    if None in (c1, c2, u1, u2, busy):
        return ""
    return (f"2 workers got {c2:.0f}% CPU against {c1:.0f}% (machine {busy:.0f}% busy of {100 * os.cpu_count()}%, "
            f"the rest is sysbench and the responder); µs per query {u1:.1f} → {u2:.1f}")


def charts(med, args, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if "basic" in args.suites:
        for field, label, fname in (("qps", "QPS", "basic-qps.png"), ("proxy_cpu_us_per_query", "proxy CPU µs per query", "basic-cpu.png")):
            fig, axes = plt.subplots(1, len(args.workloads), figsize=(4 * len(args.workloads), 3.2), squeeze=False)
            for ax, w in zip(axes[0], args.workloads):
                for x in ("direct", "haproxy", "sluice"):
                    ys = [get(med, f"basic/{w}/{t}/{x}", field) for t in args.threads]
                    if any(y is not None for y in ys):
                        ax.plot(args.threads, [y if y is not None else float("nan") for y in ys], marker="o", label=x)
                ax.set_title(w, fontsize=9)
                ax.set_xlabel("threads")
                ax.set_xscale("log", base=2)
            axes[0][0].set_ylabel(label)
            axes[0][0].legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(out / fname, dpi=90)
            plt.close(fig)
            made.append(fname)
    if "latency" in args.suites:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        xs = ["direct", "haproxy", "sluice"]
        for i, v in enumerate(("tcp", "unix")):
            ax.bar([j + i * 0.4 for j in range(3)], [latency_us(med, v, x) or 0 for x in xs], width=0.4, label=v)
        ax.set_xticks([j + 0.2 for j in range(3)], xs)
        ax.set_ylabel("µs per query, 1 thread")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=90)
        plt.close(fig)
        made.append("latency.png")
    if "long" in args.suites:
        fig, ax = plt.subplots(figsize=(4, 3.2))
        xs = ["haproxy", "sluice"]
        ax.bar(xs, [get(med, f"long/{args.idle_conns}/{x}", "rss_per_idle_conn_kb") or 0 for x in xs])
        ax.set_ylabel("KB of RSS per idle connection")
        fig.tight_layout()
        fig.savefig(out / "memory.png", dpi=90)
        plt.close(fig)
        made.append("memory.png")
    return made


def steal_warning(med, args):
    """Steal time: CPU the host took from this virtual machine. Measurements during which it took
    more than --steal-limit were taken again (bench.measure_quiet); cells whose median is still
    above it are named, since their figures, and ratios between targets in them, mean little."""
    limit = args.steal_limit
    lines = []
    again = sum(c.get("discarded", 0) for c in med.values())
    if again:
        lines += [f"The host stole more than {limit:g}% of the CPU during {again} measurements; they were taken "
                  f"again (at most {args.steal_retries} times each; the one with the least steal is kept).", ""]
    steal = {k: c["machine_steal_pct"] for k, c in med.items() if c.get("machine_steal_pct") is not None}
    hit = sorted(k for k, v in steal.items() if v > limit)
    if not hit:
        return lines
    worst = max(steal.values())
    return lines + [f"**Warning: the host stole CPU during this run.** {len(hit)} of {len(steal)} cells have a median "
                    f"steal time above {limit:g}% of the machine (up to {worst:.0f}%), so their figures are not "
                    f"comparable with a quiet run: {', '.join(hit[:8])}{' and others' if len(hit) > 8 else ''}.", ""]


def write(med, args, out, command):
    lines = [f"# sluice benchmark: {args.name}", "",
             f"Command: `{command}`", "",
             f"Machine: {os.cpu_count()} cores. Proxies run {args.workers} worker thread(s) each; sysbench, MariaDB and "
             f"the proxy share the machine. Every cell is the median of {args.rounds} round(s) of {args.duration} s, "
             "targets interleaved within each round, their order rotating from round to round. "
             "CPU is the proxy process's utime+stime over the run."
             + (f" The MariaDB server runs with `{args.server_options}` beyond the tests' options."
                if getattr(args, "server_options", None) else ""), ""]
    for again in getattr(args, "remeasured", None) or []:
        lines += [f"Measured again: the {', '.join(again['suites'])} suite(s), at commit {again['commit']} on {again['date']}, "
                  f"with `{again['command']}`; their cells replace this run's.", ""]
    lines += steal_warning(med, args)
    sections = [("basic", "Basic workloads", basic), ("ranges", "Result-set size", ranges),
                ("latency", "Added latency", latency), ("long", "Long (idle) connections", long_conns),
                ("short", "Short connections", short_conns), ("scaling", "Worker scaling", scaling),
                ("floor", "The floor: forwarders with no protocol work", floor), ("runtime", "Runtime flavours", runtime),
                ("multiplex", "Multiplexing: many clients over few backend connections", multiplex),
                ("idle", "Idle clients of a real driver", idle),
                ("drain", "Drain: moving every session off a backend", drain),
                ("split", "Read/write split over a primary and two replicas", split),
                ("features", "The cost of digests, rules and the classifier", features),
                ("capture", "Traffic capture", capture),
                ("failover", "Losing the primary: failover and switchover under load",
                 lambda med, args, lines: failover.report(med, args, lines, f, get)),
                ("tidb", "TiDB: the TiProxy report's tables in front of one tidb-server",
                 lambda med, args, lines: tidb.report(med, args, lines, f, get))]
    if any(s in args.suites for s in ("basic", "ranges", "latency", "long", "short", "scaling", "multiplex", "idle", "capture")):
        lines += ["## Targets", ""]
        targets(med, args, lines)
    for name, title, fn in sections:
        if name in args.suites:
            lines += [f"## {title}", ""]
            fn(med, args, lines)
    for png in charts(med, args, out):
        lines.append(f"![{png}]({png})")
    (out / "report.md").write_text("\n".join(lines) + "\n")
