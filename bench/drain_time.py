#!/usr/bin/env python3
"""How long a drain takes: COUNT idle sessions of a real driver (PyMySQL) through sluice, then
POST /backends/NAME/drain, timing until /backends shows none left there.

    drain_time.py HOST PORT ADMIN_PORT BACKEND COUNT

Prints "drained N sessions in S seconds (M were on BACKEND)".
"""

import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pymysql


def sessions_on(admin, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/backends") as r:
        return next(b["sessions"] for b in json.load(r) if b["name"] == name)


def main():
    host, port, admin, name, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    with ThreadPoolExecutor(64) as pool:
        conns = list(pool.map(lambda _: pymysql.connect(host=host, port=port, user="sbtest", password="sbtest",
                                                        database="sbtest", ssl_disabled=True), range(count)))
    for c in conns:
        with c.cursor() as cur:
            cur.execute("SET time_zone = '+01:00'")
    on = sessions_on(admin, name)
    json_post = {"data": b"{}", "method": "POST", "headers": {"Content-Type": "application/json"}}
    req = urllib.request.Request(f"http://127.0.0.1:{admin}/backends/{name}/drain", **json_post)
    t0 = time.monotonic()
    urllib.request.urlopen(req).read()
    while sessions_on(admin, name) > 0:
        time.sleep(0.005)
    took = time.monotonic() - t0
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{admin}/backends/{name}/undrain", **json_post)).read()
    # Every session still works, in its state.
    for c in conns:
        with c.cursor() as cur:
            cur.execute("SELECT @@time_zone")
            assert cur.fetchone()[0] == "+01:00"
        c.close()
    print(f"drained {on} sessions in {took:.3f} seconds ({count} open)", flush=True)


if __name__ == "__main__":
    main()
