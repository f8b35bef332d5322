"""What PyMySQL (Python's most used pure-Python MySQL driver) sees of a server, scenario by
scenario. Run against MariaDB directly and through sluice by tests/python_driver.rs, which
compares the outputs. The published package carries no tests, so these are the behaviours its
suite checks where a proxy could differ: character sets of the login and of SET NAMES among
many sessions, characters outside the BMP, multi-statement results and status flags (with
CLIENT_SESSION_TRACK, as its default autocommit-off sessions run), errors and warnings, types,
LOAD DATA LOCAL, KILL of an idle connection, savepoints with autocommit off, select_db, ping.

    python behaviours.py HOST PORT
prints one JSON object: scenario name -> what was seen (thread ids left out).
"""
import json
import os
import sys
import tempfile

import pymysql
from pymysql.constants import CLIENT

HOST, PORT = sys.argv[1], int(sys.argv[2])


def connect(**kw):
    args = dict(host=HOST, port=PORT, user="app", password="apppw", database="pytest_db")
    args.update(kw)
    return pymysql.connect(**args)


def run(c, sql, args=None):
    """Every result of `sql`: rows, row count, the connection's status flags and warnings after
    it; or the error's class and code."""
    out = []
    try:
        with c.cursor() as cur:
            cur.execute(sql, args)
            while True:
                rows = cur.fetchall()
                out.append([[list(map(repr, r)) for r in rows], cur.rowcount, c.server_status, getattr(cur, "warning_count", None)])
                if not cur.nextset():
                    break
    except pymysql.err.MySQLError as e:
        out.append(["error", type(e).__name__, e.args[0] if e.args else None])
    return out


def charsets():
    profiles = [
        dict(charset="utf8mb4"),
        dict(charset="latin1"),
        dict(charset="utf8mb4", collation="utf8mb4_unicode_ci"),
        dict(charset="utf8mb3"),
        dict(charset="utf8mb4", collation="utf8mb4_bin"),
    ]
    conns = [connect(autocommit=True, **profiles[i % len(profiles)]) for i in range(10)]
    out = []
    for rnd in range(4):
        for i, c in enumerate(conns):
            out.append(run(c, "SELECT @@character_set_client, @@character_set_results, @@collation_connection"))
            if profiles[i % len(profiles)]["charset"] == "utf8mb4":
                out.append(run(c, "INSERT INTO chars VALUES (%s, %s)", (rnd * 100 + i, "x\U0001F4A9y")))
                out.append(run(c, "SELECT v, HEX(v) FROM chars WHERE id = %s", (rnd * 100 + i,)))
            if rnd == 1 and i == 3:
                out.append(run(c, "SET NAMES latin1"))
    for c in conns:
        c.close()
    return out


def multi_statements():
    c = connect(client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.SESSION_TRACK)
    out = []
    for sql in [
        "SELECT 1; SELECT 2",
        "SET @x = 1; SELECT @x",
        "INSERT INTO t (v) VALUES (1), (2); UPDATE t SET v = v + 1 WHERE v > 0; DELETE FROM t WHERE v = 3",
        "SET time_zone = '+01:00'; SELECT @@time_zone",
        "COMMIT",
        "SELECT 1; SELECT nope FROM t",
        "START TRANSACTION; INSERT INTO t (v) VALUES (9); COMMIT",
    ]:
        out.append([sql, run(c, sql)])
    c.close()
    return out


def errors_and_types():
    c = connect(autocommit=True)
    out = [run(c, "INSERT INTO k VALUES (1), (1)"), run(c, "SELECT * FROM nowhere"), run(c, "SELECT 1 +")]
    with c.cursor() as cur:
        cur.execute(
            "SELECT 18446744073709551615, CAST(1.50 AS DECIMAL(10,2)), DATE('2024-02-29'), "
            "TIMESTAMP('2024-02-29 12:34:56.789'), X'00FF', NULL, 1.5e300, 'ü', JSON_OBJECT('a', 1), TIME('-12:00:01')"
        )
        out.append([list(map(repr, cur.fetchone())), [list(d) for d in cur.description]])
    out.append(run(c, "SELECT 1 + 'x'"))
    out.append(run(c, "SHOW WARNINGS"))
    c.close()
    return out


def load_data_local():
    c = connect(local_infile=True, autocommit=True)
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("10\n11\n12\n")
    try:
        return [run(c, f"LOAD DATA LOCAL INFILE '{f.name}' INTO TABLE t FIELDS TERMINATED BY ',' (v)"), run(c, "SELECT COUNT(*) FROM t WHERE v >= 10")]
    finally:
        os.unlink(f.name)
        c.close()


def kill_idle():
    a, b = connect(autocommit=True), connect(autocommit=True)
    killed = run(a, "KILL %s", (b.thread_id(),))
    after = run(b, "SELECT 1")
    a.close()
    # (Which error a dead connection gives is a matter of timing: only that it failed.)
    return [killed, after[0][0] == "error"]


def savepoints():
    a, b = connect(), connect()
    out = []
    for who, sql in [
        (a, "SAVEPOINT sp1"),
        (b, "ROLLBACK TO SAVEPOINT sp1"),
        (a, "INSERT INTO t (v) VALUES (100)"),
        (a, "SAVEPOINT sp2"),
        (b, "SELECT COUNT(*) FROM t WHERE v = 100"),
        (a, "ROLLBACK TO SAVEPOINT sp2"),
        (a, "ROLLBACK TO SAVEPOINT sp1"),
        (a, "SELECT COUNT(*) FROM t WHERE v = 100"),
        (a, "COMMIT"),
        (b, "ROLLBACK"),
    ]:
        out.append(["a" if who is a else "b", sql, run(who, sql)])
    a.close()
    b.close()
    return out


def select_db_and_ping():
    c = connect(autocommit=True)
    c.select_db("test")
    out = [run(c, "SELECT DATABASE()")]
    c.ping(reconnect=False)
    out.append(run(c, "SELECT DATABASE(), @@autocommit"))
    c.autocommit(False)
    out.append(run(c, "SELECT @@autocommit"))
    c.rollback()
    c.close()
    return out


def main():
    setup = connect(database=None, autocommit=True, client_flag=CLIENT.MULTI_STATEMENTS)
    run(
        setup,
        "CREATE DATABASE IF NOT EXISTS test; DROP DATABASE IF EXISTS pytest_db; CREATE DATABASE pytest_db; USE pytest_db; "
        "CREATE TABLE chars (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET utf8mb4); "
        "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE = InnoDB; CREATE TABLE k (id INT PRIMARY KEY)",
    )
    setup.close()
    out = {}
    for name, scenario in [
        ("charsets", charsets),
        ("multi_statements", multi_statements),
        ("errors_and_types", errors_and_types),
        ("load_data_local", load_data_local),
        ("kill_idle", kill_idle),
        ("savepoints", savepoints),
        ("select_db_and_ping", select_db_and_ping),
    ]:
        try:
            out[name] = scenario()
        except Exception as e:  # what failed is what was seen
            out[name] = {"threw": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))


main()
