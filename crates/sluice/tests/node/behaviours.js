// What Node.js's most used MySQL driver, `mysql2`, sees of a server, scenario by scenario. Run
// against MariaDB directly and through sluice by tests/node_driver.rs, which compares the two
// outputs. The published package carries no tests, so these are the behaviours its suite checks
// where sluice could differ: characters outside the BMP in a session's own character set, among
// many sessions with other character sets; the OK packets of multi-statements (status flags,
// affected rows, messages); errors; types; LOAD DATA LOCAL; change of user; KILL of an idle
// pooled connection, alone and among other statements; prepared statements prepared and closed in a loop; savepoints with
// autocommit off.
//
//   node behaviours.js HOST PORT
// prints one JSON object: scenario name -> what was seen (thread ids left out).
"use strict";
const mysql = require("mysql2");

const [host, port] = [process.argv[2], Number(process.argv[3])];
const base = { host, port, user: "app", password: "apppw", database: "nodetest" };

function connect(opts) {
  const c = mysql.createConnection({ ...base, ...opts });
  return new Promise((ok, fail) => c.connect((e) => (e ? fail(e) : ok(c))));
}

function query(c, sql, values) {
  return new Promise((ok) => c.query(sql, values, (e, rows, fields) => ok({ e, rows, fields })));
}

function end(c) {
  return new Promise((ok) => c.end(() => ok()));
}

// An OK packet or an error as the driver reports it, without ids that differ from run to run.
function packet(r) {
  if (r.e) return { code: r.e.code, errno: r.e.errno, sqlState: r.e.sqlState, fatal: !!r.e.fatal };
  const one = (p) =>
    p && !Array.isArray(p) && typeof p.affectedRows === "number"
      ? { affectedRows: p.affectedRows, changedRows: p.changedRows, serverStatus: p.serverStatus, warningStatus: p.warningStatus, info: p.info }
      : p;
  return Array.isArray(r.rows) ? r.rows.map((x) => (Array.isArray(x) ? x.map(one) : one(x))) : one(r.rows);
}

const scenarios = {
  // Emoji written and read back in utf8mb4 while other sessions use other character sets.
  async nonBmpChars() {
    const charsets = ["UTF8MB4_GENERAL_CI", "LATIN1_SWEDISH_CI", "UTF8_GENERAL_CI", "UTF8MB4_UNICODE_CI", "LATIN1_BIN"];
    const conns = await Promise.all(Array.from({ length: 10 }, (_, i) => connect({ charset: charsets[i % charsets.length] })));
    const out = [];
    for (let round = 0; round < 5; round++) {
      await Promise.all(
        conns.map(async (c, i) => {
          const cs = charsets[i % charsets.length];
          const state = await query(c, "SELECT @@character_set_client AS c, @@character_set_results AS r, @@collation_connection AS k");
          out.push([round, i, state.rows[0]]);
          if (cs.startsWith("UTF8MB4")) {
            const id = round * 100 + i;
            await query(c, "INSERT INTO chars VALUES (?, ?)", [id, "x\u{1F4A9}y"]);
            const back = await query(c, "SELECT v, HEX(v) AS h FROM chars WHERE id = ?", [id]);
            out.push([round, i, back.rows[0]]);
          }
        }),
      );
    }
    await Promise.all(conns.map(end));
    out.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    return out;
  },

  // The OK packets and result sets of multi-statements, in and out of transactions.
  async multiStatements() {
    const c = await connect({ multipleStatements: true });
    const out = [];
    for (const sql of [
      "SELECT 1 AS a; SELECT 2 AS b",
      "SET @x = 1; SELECT @x AS x",
      "INSERT INTO t (v) VALUES (1), (2); UPDATE t SET v = v + 1 WHERE v > 0; DELETE FROM t WHERE v = 3",
      "UPDATE t SET v = v WHERE v = 2",
      "SET time_zone = '+01:00'; SELECT 1",
      "START TRANSACTION; INSERT INTO t (v) VALUES (9); SELECT COUNT(*) AS n FROM t; COMMIT",
      "SELECT 1; SELECT nope FROM t",
      "USE nodetest; SELECT DATABASE() AS d",
    ]) {
      out.push([sql, packet(await query(c, sql))]);
    }
    await end(c);
    return out;
  },

  async errorsAndTypes() {
    const c = await connect({ supportBigNumbers: true, bigNumberStrings: true, dateStrings: true });
    const out = [];
    out.push(packet(await query(c, "INSERT INTO k VALUES (1), (1)")));
    out.push(packet(await query(c, "SELECT * FROM nowhere")));
    out.push(packet(await query(c, "SELECT 1 +")));
    const types = await query(
      c,
      "SELECT 18446744073709551615 AS big, CAST(1.50 AS DECIMAL(10,2)) AS d, DATE('2024-02-29') AS day, " +
        "TIMESTAMP('2024-02-29 12:34:56.789') AS ts, X'00FF' AS bin, NULL AS n, 1.5e300 AS dbl, 'ü' AS u, JSON_OBJECT('a', 1) AS j",
    );
    out.push(types.rows.map((r) => ({ ...r, bin: r.bin.toString("hex") })));
    out.push(types.fields.map((f) => [f.name, f.columnType, f.columnLength, f.flags, f.decimals, f.characterSet]));
    out.push(packet(await query(c, "SELECT 1 + 'x' AS w")));
    out.push(packet(await query(c, "SHOW WARNINGS")));
    await end(c);
    return out;
  },

  async loadDataLocal() {
    const { Readable } = require("stream");
    const c = await connect({});
    const r = await new Promise((ok) =>
      c.query(
        { sql: "LOAD DATA LOCAL INFILE 'rows.csv' INTO TABLE t FIELDS TERMINATED BY ',' (v)", infileStreamFactory: () => Readable.from([Buffer.from("10\n11\n"), Buffer.from("12\n")]) },
        (e, rows) => ok({ e, rows }),
      ),
    );
    const n = await query(c, "SELECT COUNT(*) AS n FROM t WHERE v >= 10");
    await end(c);
    return [packet(r), n.rows];
  },

  async changeUser() {
    const c = await connect({});
    const seen = [];
    seen.push((await query(c, "SELECT CURRENT_USER() AS u, DATABASE() AS d")).rows);
    const r = await new Promise((ok) => c.changeUser({ user: "app", password: "apppw", database: "test" }, (e) => ok(e ? e.code : "ok")));
    seen.push(r);
    seen.push((await query(c, "SELECT CURRENT_USER() AS u, DATABASE() AS d, @@session.sql_mode = @@global.sql_mode AS fresh")).rows);
    await end(c);
    return seen;
  },

  // A pool's idle connection killed by another: it errors, and the pool goes on.
  async killIdlePooled() {
    const pool = mysql.createPool({ ...base, connectionLimit: 2 });
    const get = () => new Promise((ok, fail) => pool.getConnection((e, c) => (e ? fail(e) : ok(c))));
    const a = await get();
    const b = await get();
    const id = a.threadId;
    a.on("error", () => {});
    const killed = packet(await query(b, "KILL ?", [id]));
    // (Which error a dead socket gives, EPIPE or a lost connection, is a matter of timing.)
    const dead = await query(a, "SELECT 1 AS one");
    const after = dead.e ? { failed: true, fatal: !!dead.e.fatal } : packet(dead);
    b.release();
    a.destroy();
    const again = await get();
    const ok = packet(await query(again, "SELECT 2 AS two"));
    again.release();
    await new Promise((r) => pool.end(r));
    return { killed, after, ok };
  },

  // The pool's own test of a killed connection (test-pool-disconnect): a pool of one releases
  // its connection, another connection sends `kill <its id>; select sleep(0.05)`, and the pool
  // then hands out a new connection, not the killed one.
  async killReleasedAmongStatements() {
    const pool = mysql.createPool({ ...base, connectionLimit: 1 });
    const get = () => new Promise((ok, fail) => pool.getConnection((e, c) => (e ? fail(e) : ok(c))));
    const a = await get();
    const first = a.threadId;
    a.on("error", () => {});
    a.release();
    const killer = await connect({ multipleStatements: true });
    const killed = packet(await query(killer, `kill ${first}; select sleep(0.05) AS s`));
    const again = await get();
    const fresh = again.threadId !== first;
    const ok = packet(await query(again, "SELECT 3 AS three"));
    again.release();
    await end(killer);
    await new Promise((r) => pool.end(r));
    return { killed, fresh, ok };
  },

  // Prepared statements, prepared and closed in a loop by several connections.
  async preparedLoop() {
    const conns = await Promise.all(Array.from({ length: 3 }, () => mysql.createConnection(base).promise()));
    const out = [];
    await Promise.all(
      conns.map(async (c, i) => {
        for (let n = 0; n < 40; n++) {
          const sql = `SELECT ? + ${n} AS v, ${i} AS c`;
          try {
            const [rows] = await c.execute(sql, [i]);
            out.push([i, n, rows[0].v]);
          } catch (e) {
            out.push([i, n, e.code]);
          }
          c.unprepare(sql);
        }
      }),
    );
    await Promise.all(conns.map((c) => c.end()));
    out.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    return out;
  },

  // Savepoints with autocommit off, while another session runs.
  async savepoints() {
    const a = await connect({});
    const b = await connect({});
    const out = [];
    for (const [c, sql] of [
      [a, "SET autocommit = 0"],
      [a, "SAVEPOINT sp1"],
      [b, "ROLLBACK TO SAVEPOINT sp1"],
      [a, "INSERT INTO t (v) VALUES (100)"],
      [a, "SAVEPOINT sp2"],
      [b, "SELECT COUNT(*) AS n FROM t WHERE v = 100"],
      [a, "ROLLBACK TO SAVEPOINT sp2"],
      [a, "ROLLBACK TO SAVEPOINT sp1"],
      [a, "SELECT COUNT(*) AS n FROM t WHERE v = 100"],
      [a, "COMMIT"],
    ]) {
      out.push([c === a ? "a" : "b", sql, packet(await query(c, sql))]);
    }
    await Promise.all([end(a), end(b)]);
    return out;
  },
};

(async () => {
  const setup = await connect({ database: undefined, multipleStatements: true });
  await query(
    setup,
    "CREATE DATABASE IF NOT EXISTS test; DROP DATABASE IF EXISTS nodetest; CREATE DATABASE nodetest; USE nodetest; " +
      "CREATE TABLE chars (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET utf8mb4); " +
      "CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v INT) ENGINE = InnoDB; CREATE TABLE k (id INT PRIMARY KEY)",
  );
  await end(setup);
  const out = {};
  for (const [name, run] of Object.entries(scenarios)) {
    try {
      out[name] = await run();
    } catch (e) {
      out[name] = { threw: String(e && (e.code || e.message)) };
    }
  }
  process.stdout.write(JSON.stringify(out, null, 1) + "\n");
})();
