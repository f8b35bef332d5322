"""The capture suite's measurement: what traffic capture costs the relay, as the TiProxy seed's
table has it (oltp_read_write, average and lowest one-second QPS, capture off and on).

On a shared host, two sysbench runs a few seconds apart differ by several percent, more than
the capture's cost, so off and on are not two runs: one sysbench run goes through one sluice
while capture is switched on and off every --capture-phase seconds (--capture-phases phases,
off and on in turn, the first of them alternating from round to round), after a phase of
warm-up with capture off that is not measured. Each kind is measured
over its own seconds of that run, the first second after each switch left out: one-second QPS
samples (their mean and lowest), p95, and the proxy's CPU over the same seconds. Every capture
phase starts while all sessions are open (each is recorded with its state first). The captures'
rate and size are their sum; the last one is then replayed against the server."""

import os
from pathlib import Path
import re
import subprocess
import threading
import time


def measure(env, cell, target, args, admin, replay):
    """Figures for capture-off and capture-on (under "halves"); `admin` asks sluice's admin API,
    `replay` replays a capture directory: its commands per second."""
    t = env.targets[target]
    phase, phases = args.capture_phase, args.capture_phases
    cell.runs = getattr(cell, "runs", 0) + 1
    first_on = cell.runs % 2 == 0
    cmd = env.sysbench_cmd(t, cell.workload, cell.threads, phase * (phases + 1), ["--report-interval=1"])
    m0 = env.machine_cpu()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, started = [], threading.Event()

    def read():
        for line in p.stdout:
            lines.append(line)
            if line.startswith("Threads started"):
                started.set()
        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(120)
    t0 = time.monotonic() + phase  # (after the warm-up)
    windows, captures, cap_dir, last_dir = [], [], None, None
    for i in range(phases):
        on = (i % 2 == 1) != first_on
        sleep_until(t0 + i * phase + 0.3)
        if cap_dir is not None:
            captures.append(admin(t, "/capture/stop", {}))
        cap_dir = None
        if on:
            cap_dir = last_dir = Path(args.capture_dir or env.work) / f"capture-{cell.threads}-{time.time_ns()}"
            admin(t, "/capture/start", {"name": str(cap_dir)})
        # The phase is measured from its second second to its end (sysbench's samples (i+1)*phase+2
        # to (i+2)*phase, after the warm-up), the proxy's CPU over the same span.
        sleep_until(t0 + i * phase + 1.0)
        c0 = cpu_now(env, t.pid, p.pid)
        sleep_until(t0 + (i + 1) * phase)
        used = [b - a for a, b in zip(c0, cpu_now(env, t.pid, p.pid))]
        windows.append((on, (i + 1) * phase + 2, (i + 2) * phase, used))
    if cap_dir is not None:
        captures.append(admin(t, "/capture/stop", {}))
    reader.join()
    p.wait()
    m1 = env.machine_cpu()
    text = "".join(lines)
    if p.returncode != 0:
        raise RuntimeError(f"sysbench failed on {target}: {text}")
    samples = {int(n): (float(q), float(l)) for n, q, l in
               re.findall(r"^\[ *(\d+)s \] thds: \d+ tps: [\d.]+ qps: ([\d.]+) .*?lat \(ms,95%\): ([\d.]+)", text, re.M)}
    errors = int(re.search(r"ignored errors:\s+(\d+)", text).group(1))
    halves = {kind: half(windows, samples, kind == "capture-on", errors) for kind in ("capture-off", "capture-on")}
    on = halves["capture-on"]
    seconds_on = phase * sum(1 for w in windows if w[0])
    written = sum(c["bytes_written"] for c in captures)
    commands = sum(c["commands"] for c in captures)
    on.update({"capture_mb_per_s": written / seconds_on / 1e6, "capture_bytes_per_command": written / max(commands, 1),
               "capture_raw_bytes_per_command": sum(c["bytes_raw"] for c in captures) / max(commands, 1),
               "capture_dropped": sum(c["dropped_records"] for c in captures), "capture_commands": commands})
    if last_dir is not None:
        on["replay_commands_per_s"] = replay(t, last_dir)
    steal = 100.0 * os.cpu_count() * (m1[1] - m0[1]) / max(m1[2] - m0[2], 1)
    for h in halves.values():
        h["machine_steal_pct"] = steal
    return {"qps": on["qps"], "proxy_cpu_us_per_query": on["proxy_cpu_us_per_query"], "qps_off": halves["capture-off"]["qps"],
            "cpu_off": halves["capture-off"]["proxy_cpu_us_per_query"],
            "machine_steal_pct": steal, "halves": halves}


def cpu_now(env, proxy, sysbench):
    """CPU seconds so far of the proxy, the server and sysbench; busy and all jiffies of the machine."""
    busy, _, total = env.machine_cpu()
    return env.cpu_seconds(proxy), env.server_cpu() or 0.0, env.cpu_seconds(sysbench), busy, total


def half(windows, samples, on, errors):
    """The figures of the seconds of one kind (capture on, or off)."""
    qps, p95, queries = [], [], 0.0
    cpu = [0.0] * 5
    for kind, first, last, used in windows:
        if kind != on:
            continue
        got = [samples[n] for n in range(first, last + 1) if n in samples]
        qps += [q for q, _ in got]
        p95 += [l for _, l in got]
        cpu = [a + b for a, b in zip(cpu, used)]
        queries += sum(q for q, _ in got)
    if not qps:
        raise RuntimeError("sysbench reported no one-second samples")
    seconds = len(qps)
    p95.sort()
    return {"qps": sum(qps) / seconds, "min_qps": min(qps), "samples": seconds, "qps_samples": qps, "p95_ms": p95[len(p95) // 2],
            "proxy_cpu_pct": 100.0 * cpu[0] / seconds, "proxy_cpu_us_per_query": 1e6 * cpu[0] / max(queries, 1),
            "server_cpu_us_per_query": 1e6 * cpu[1] / max(queries, 1), "sysbench_cpu_us_per_query": 1e6 * cpu[2] / max(queries, 1),
            "machine_busy_pct": 100.0 * cpu[3] / max(cpu[4], 1), "errors": errors}


def sleep_until(at):
    left = at - time.monotonic()
    if left > 0:
        time.sleep(left)
