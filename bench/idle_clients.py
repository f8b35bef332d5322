#!/usr/bin/env python3
"""Opens idle client connections the way an application's driver does, and holds them.

    idle_clients.py HOST PORT USER PASSWORD DATABASE COUNT [CONCURRENCY]

PyMySQL logs in with a schema and its connection attributes (program name, client version),
COUNT connections opened CONCURRENCY at a time. Prints "held N" once they are open (or "failed
N: error" and exits 1), then holds them until its standard input closes.
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import pymysql


def main():
    host, port, user, password, db, count = sys.argv[1:7]
    concurrency = int(sys.argv[7]) if len(sys.argv) > 7 else 64

    def open_one(_):
        return pymysql.connect(host=host, port=int(port), user=user, password=password, database=db,
                               program_name="sluice-bench-idle", connect_timeout=60)

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            conns = list(pool.map(open_one, range(int(count))))
    except Exception as e:  # noqa: BLE001 - any failure is reported as such
        print(f"failed {count}: {e}", flush=True)
        sys.exit(1)
    print(f"held {len(conns)}", flush=True)
    sys.stdin.read()
    for c in conns:
        c.close()


if __name__ == "__main__":
    main()
