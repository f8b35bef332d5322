"""Loopback ports for the benchmark harness: free ones to listen on, and waiting until a
process listens."""

import socket
import time


def free_port():
    return free_ports(1)[0]


def free_ports(n):
    """n distinct free loopback ports: held open together while they are picked (two ports
    picked one after the other may be the same one)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port, proc, timeout=60):
    """Waits until something listens on `port`; an error if `proc` (when given) exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for port {port} exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")
