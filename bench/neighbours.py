"""The neighbours workload: everything else an application runs against a busy
latched table, beside the same queries against a plain one, in one run.

Two identical tables -- `nb_latched` (latched, gapless) and `nb_plain` -- and
their outboxes are written by producers committing 1-3 events and an outbox
row per transaction, drawing keys in one order and committing in another.
Against both at once run the application's other reads (newest first,
`max(id)`, a count beside a max, point lookups, paging back from a key, a
history range, a read by another column, a count, COPY, the newest rows
joined, a retention DELETE, a REPEATABLE READ report) and its consumers (a
tail with a parameter cursor, one joined to a lookup table, one whose
cursor is read from an offsets table, the same `FOR UPDATE` in a CTE, in
READ COMMITTED and as the first statement of a REPEATABLE READ poll, a
poll that is a later statement of a REPEATABLE READ transaction, a
`FOR UPDATE` batch, an outbox relay's `DELETE ... RETURNING`).  Per kind
and table: statements, errors by SQLSTATE, p50/p99 latency and the ratio
to the plain table; per consumer: rows skipped (the plain table's must be
more than zero, or the run proves nothing) and lag, from a row's commit to
its delivery.  Each scan mode in turn.

`--idle-writer` runs the consumers alone, twice per mode: once as above and
once beside a writer that holds a latch far past every consumer's rows and
sits idle in its transaction for 5 s at a time (then rolls back).  A
consumer that waits only for writers behind its rows keeps its lag; one
that waits for every writer in its declared span takes up to 5 s more.

    bench/run --neighbours [--seconds 30] [--modes optimistic,fenced] [--idle-writer] [--out DIR]
"""
import argparse
import json
import random
import sys
import threading
import time

import psycopg

import common

TABLES = ("nb_latched", "nb_plain")
SEED_ROWS = 5000
BATCH = 100


def setup():
    common.recreate_database()
    with common.connect() as c:
        c.execute("CREATE TABLE nb_kinds (kind int PRIMARY KEY, name text)")
        c.execute("INSERT INTO nb_kinds SELECT g, 'kind ' || g FROM generate_series(0, 3) g")
        for t in TABLES:
            c.execute(f"CREATE TABLE {t} (id bigserial PRIMARY KEY, kind int NOT NULL, "
                      "created_at timestamptz NOT NULL DEFAULT now(), payload text)")
            c.execute(f"ALTER SEQUENCE {t}_id_seq CACHE 1")
            c.execute(f"CREATE INDEX ON {t} (kind, created_at)")
            c.execute(f"CREATE TABLE {t}_outbox (id bigserial PRIMARY KEY, event bigint NOT NULL)")
            c.execute(f"ALTER SEQUENCE {t}_outbox_id_seq CACHE 1")
            c.execute(f"CREATE TABLE {t}_offsets (name text PRIMARY KEY, c bigint NOT NULL)")
            if t == "nb_latched":
                c.execute(f"SELECT pgkvx.enable('{t}', gapless => true)")
                c.execute(f"SELECT pgkvx.enable('{t}_outbox', gapless => true)")
            c.execute(f"INSERT INTO {t} (kind, payload) SELECT g % 4, 'seed' FROM generate_series(1, {SEED_ROWS}) g")
            c.execute(f"ANALYZE {t}")


class Shared:
    def __init__(self):
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.committed = {t: set() for t in TABLES}
        self.outbox = {t: set() for t in TABLES}
        self.commit_at = {}  # (table, id) -> perf_counter() after its commit
        self.fatal = []


def producer(sh, t, seed):
    rnd = random.Random(seed)
    try:
        with common.connect(autocommit=False) as c:
            while not sh.stop.is_set():
                ids = []
                for _ in range(rnd.randint(1, 3)):
                    ids.append(c.execute(f"INSERT INTO {t} (kind, payload) VALUES (%s, 'event') RETURNING id",
                                         (rnd.randrange(4),)).fetchone()[0])
                    time.sleep(rnd.random() * 0.002)
                (ob,) = c.execute(f"INSERT INTO {t}_outbox (event) VALUES (%s) RETURNING id", (ids[-1],)).fetchone()
                c.commit()
                now = time.perf_counter()
                with sh.lock:
                    sh.committed[t].update(ids)
                    sh.outbox[t].add(ob)
                    sh.commit_at.update({(t, i): now for i in ids})
                    sh.commit_at[(f"{t}_outbox", ob)] = now
                time.sleep(0.002 + rnd.random() * 0.003)
    except Exception as e:  # noqa: BLE001 - the report says
        sh.fatal.append(f"producer {t}: {e!r}")


IDLE_KEY = 10 ** 15  # far past any key a run draws: past every consumer's rows
IDLE_SECONDS = 5


def idle_writer(sh, t):
    """A writer past every consumer's rows: latches a key far ahead in the
    table and its outbox, sits idle in its transaction, rolls back."""
    try:
        with common.connect(autocommit=False) as c:
            while not sh.stop.is_set():
                if t == "nb_latched":
                    for table in (t, f"{t}_outbox"):
                        c.execute("SELECT pgkvx.latch_span(%s, %s, %s)", (table, str(IDLE_KEY), str(IDLE_KEY + 1)))
                else:  # the same idle transaction id, with nothing to latch
                    c.execute("SELECT pg_current_xact_id()")
                sh.stop.wait(IDLE_SECONDS)
                c.rollback()
                sh.stop.wait(0.2)
    except Exception as e:  # noqa: BLE001 - the report says
        sh.fatal.append(f"idle writer {t}: {e!r}")


def other_reads(t, rnd, head):
    """The application's other statements: name -> (isolation, statements
    of one transaction as (sql, params))."""
    k = rnd.randint(1, max(head(), 2))
    return {
        "newest first": (None, [(f"SELECT id, payload FROM {t} ORDER BY id DESC LIMIT 20", None)]),
        "max(id)": (None, [(f"SELECT max(id) FROM {t}", None)]),
        "count beside a max": (None, [(f"SELECT count(*) FROM {t} WHERE id > (SELECT max(id) - 100 FROM {t})", None)]),
        "point lookup": (None, [(f"SELECT * FROM {t} WHERE id = %s", (k,))]),
        "paging back from a key": (None, [(f"SELECT id FROM {t} WHERE id < %s ORDER BY id DESC LIMIT 20", (k,))]),
        "history range": (None, [(f"SELECT id FROM {t} WHERE id >= %s AND id < %s ORDER BY id", (k, k + 50))]),
        "by another column": (None, [(f"SELECT id FROM {t} WHERE kind = 1 ORDER BY created_at DESC LIMIT 20", None)]),
        "count": (None, [(f"SELECT count(*) FROM {t} WHERE id > %s", (max(k - 500, 0),))]),
        "COPY": (None, [(f"COPY (SELECT id, payload FROM {t} WHERE id > %s ORDER BY id LIMIT 100) TO STDOUT", (k,))]),
        "newest joined": (None, [(f"SELECT e.id, k.name FROM {t} e JOIN nb_kinds k USING (kind) "
                                  "ORDER BY e.id DESC LIMIT 20", None)]),
        "retention delete": (None, [(f"DELETE FROM {t} WHERE id < (SELECT min(id) + 20 FROM {t}) AND id <= %s "
                                     "RETURNING id", (SEED_ROWS // 2,))]),
        "REPEATABLE READ report": ("rr", [(f"SELECT count(*) FROM {t}", None),
                                          (f"SELECT id FROM {t} ORDER BY id DESC LIMIT 20", None)]),
    }


def timed(c, sql, params):
    t0 = time.perf_counter()
    if sql.startswith("COPY"):
        with c.cursor() as cur, cur.copy(sql, params) as cp:
            for _ in cp:
                pass
    else:
        c.execute(sql, params).fetchall()
    return (time.perf_counter() - t0) * 1000


def reader(sh, t, name, mode, out, seed):
    rnd = random.Random(seed)
    lat, errs = [], {}
    head = lambda: max(sh.committed[t], default=SEED_ROWS)  # noqa: E731
    with common.connect(scan_mode=mode, autocommit=False) as c:
        while not sh.stop.is_set():
            iso, stmts = other_reads(t, rnd, head)[name]
            c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ if iso else None
            t0 = time.perf_counter()
            try:
                for sql, params in stmts:
                    timed(c, sql, params)
                c.commit()
                lat.append((time.perf_counter() - t0) * 1000)
            except psycopg.Error as e:
                errs[e.sqlstate] = errs.get(e.sqlstate, 0) + 1
                c.rollback()
            if name == "retention delete":
                time.sleep(0.05)
    out[(t, name)] = {"latency_ms": lat, "errors": errs}


CONSUMERS = ["tail, parameter cursor", "tail joined", "cursor from a table", "FOR UPDATE CTE cursor",
             "REPEATABLE READ poll, FOR UPDATE CTE", "REPEATABLE READ poll after a read", "FOR UPDATE batch",
             "relay DELETE ... RETURNING"]


def consumer_sql(t, shape):
    return {
        "tail, parameter cursor": f"SELECT id FROM {t} WHERE id > %(c)s ORDER BY id LIMIT {BATCH}",
        "tail joined": (f"SELECT e.id FROM {t} e JOIN nb_kinds k USING (kind) WHERE e.id > %(c)s "
                        f"ORDER BY e.id LIMIT {BATCH}"),
        "cursor from a table": (f"SELECT id FROM {t} WHERE id > (SELECT c FROM {t}_offsets WHERE name = %(n)s) "
                                f"ORDER BY id LIMIT {BATCH}"),
        "FOR UPDATE CTE cursor": (f"WITH o AS (SELECT c FROM {t}_offsets WHERE name = %(n)s FOR UPDATE) "
                                  f"SELECT e.id FROM {t} e, o WHERE e.id > o.c ORDER BY e.id LIMIT {BATCH}"),
        "REPEATABLE READ poll, FOR UPDATE CTE": (
            f"WITH o AS (SELECT c FROM {t}_offsets WHERE name = %(n)s FOR UPDATE) "
            f"SELECT e.id FROM {t} e, o WHERE e.id > o.c ORDER BY e.id LIMIT {BATCH}"),
        # A later statement of the transaction: its snapshot is fixed, so a
        # conflict it cannot repair is a 40001 (the README gives the rate).
        "REPEATABLE READ poll after a read": f"SELECT id FROM {t} WHERE id > %(c)s ORDER BY id LIMIT {BATCH}",
        "FOR UPDATE batch": f"SELECT id FROM {t} WHERE id > %(c)s ORDER BY id LIMIT {BATCH} FOR UPDATE",
        "relay DELETE ... RETURNING": (f"DELETE FROM {t}_outbox WHERE id IN (SELECT id FROM {t}_outbox "
                                       f"WHERE id > %(c)s ORDER BY id LIMIT {BATCH}) RETURNING id"),
    }[shape]


def consumer(sh, t, shape, mode, out):
    lat, errs, got, lag = [], {}, [], []
    name = f"{shape}/{mode}"
    relay = shape.startswith("relay")
    with common.connect(scan_mode=mode, autocommit=False) as c:
        if shape.startswith("REPEATABLE"):
            c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        table = f"{t}_outbox" if relay else t
        (start,) = c.execute(f"SELECT coalesce(max(id), 0) FROM {table}").fetchone()
        c.execute(f"INSERT INTO {t}_offsets VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET c = excluded.c",
                  (name, start))
        c.commit()
        cursor, idle, sql = start, 0, consumer_sql(t, shape)
        while idle < 3:
            t0 = time.perf_counter()
            try:
                if shape == "REPEATABLE READ poll after a read":
                    c.execute(f"SELECT c FROM {t}_offsets WHERE name = %s", (name,))
                ids = sorted(r[0] for r in c.execute(sql, {"c": cursor, "n": name}).fetchall())
                if ids:
                    cursor = ids[-1]
                    c.execute(f"UPDATE {t}_offsets SET c = %s WHERE name = %s", (cursor, name))
                c.commit()
            except psycopg.Error as e:
                errs[e.sqlstate] = errs.get(e.sqlstate, 0) + 1
                c.rollback()
                continue
            now = time.perf_counter()
            if not sh.stop.is_set():
                lat.append((now - t0) * 1000)
                with sh.lock:
                    lag.extend(max(now - sh.commit_at[(table, i)], 0) * 1000 for i in ids
                               if (table, i) in sh.commit_at)
            got.extend(ids)
            if sh.stop.is_set():
                idle = idle + 1 if not ids else 0
            elif not ids:
                time.sleep(0.001)
    out[(t, shape)] = {"latency_ms": lat, "errors": errs, "got": got, "start": start, "cursor": cursor,
                       "lag_ms": lag}


def phase(mode, seconds, idle=None):
    """One run: `idle` None runs everything; False or True only the
    consumers, without or beside the idle writer."""
    sh = Shared()
    out = {}
    threads = [threading.Thread(target=producer, args=(sh, t, i)) for t in TABLES for i in range(3)]
    for t in TABLES:
        if idle is None:
            for i, name in enumerate(other_reads(t, random.Random(0), lambda: SEED_ROWS)):
                threads.append(threading.Thread(target=reader, args=(sh, t, name, mode, out, i)))
        if idle:
            threads.append(threading.Thread(target=idle_writer, args=(sh, t)))
        for shape in CONSUMERS:
            threads.append(threading.Thread(target=consumer, args=(sh, t, shape, mode, out)))
    common.log(f"{mode}: {len(threads)} sessions for {seconds:g} s")
    for th in threads:
        th.start()
    time.sleep(seconds)
    sh.stop.set()
    for th in threads:
        th.join()
    if sh.fatal:
        raise RuntimeError("; ".join(sh.fatal))
    rows = []
    for (t, name), r in sorted(out.items()):
        lat = r["latency_ms"]
        row = {"table": t, "kind": name, "statements": len(lat) + sum(r["errors"].values()),
               "errors": r["errors"], "p50_ms": common.percentile(lat, 50), "p99_ms": common.percentile(lat, 99)}
        if "got" in r:
            committed = sh.outbox[t] if name.startswith("relay") else sh.committed[t]
            seen = set(r["got"])
            row["rows"] = len(r["got"])
            row["skipped"] = sum(1 for i in committed if r["start"] < i <= r["cursor"] and i not in seen)
            row["duplicates"] = len(r["got"]) - len(seen)
            row["lag_p50_ms"] = common.percentile(r["lag_ms"], 50)
            row["lag_p99_ms"] = common.percentile(r["lag_ms"], 99)
            row["consumer"] = True
        rows.append(row)
    return rows


def ms(v):
    """A latency for the tables: one decimal, a dash for none."""
    return "–" if v is None else f"{v:.1f}"


def markdown(result):
    if "idle" in result:
        return idle_markdown(result)
    lines = [f"# pgkvx neighbours: {result['started']}", "",
             f"PostgreSQL {result['server']}, pgkvx at {result['git']}; {result['seconds']:g} s per mode; "
             "3 producers per table; every kind one session per table, both tables at once.", ""]
    for mode, rows in result["modes"].items():
        lines += [f"## `pgkvx.scan_mode = {mode}`", "",
                  "| kind | statements (latched / plain) | errors latched | errors plain | p50 ms latched / plain "
                  "| p99 ms latched / plain | p50 ratio | p99 ratio | skipped latched / plain |",
                  "|---|---:|---|---|---:|---:|---:|---:|---:|"]
        by = {(r["table"], r["kind"]): r for r in rows}
        for kind in dict.fromkeys(r["kind"] for r in rows):
            a, b = by[("nb_latched", kind)], by[("nb_plain", kind)]
            ratio = lambda q: a[q] / b[q] if a[q] and b[q] else None  # noqa: E731
            r = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
            errs = lambda r: ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"  # noqa: E731
            skipped = f"{a['skipped']} / {b['skipped']}" if a.get("consumer") else ""
            lines.append(f"| {kind} | {a['statements']} / {b['statements']} | {errs(a)} | {errs(b)} | "
                         f"{ms(a['p50_ms'])} / {ms(b['p50_ms'])} | {ms(a['p99_ms'])} / {ms(b['p99_ms'])} | "
                         f"{r(ratio('p50_ms'))} | {r(ratio('p99_ms'))} | {skipped} |")
        lines.append("")
    return "\n".join(lines)


def idle_markdown(result):
    """Consumers' lag without and beside the idle writer, per mode."""
    lines = [f"# pgkvx neighbours, idle writer: {result['started']}", "",
             f"PostgreSQL {result['server']}, pgkvx at {result['git']}; {result['seconds']:g} s per run; "
             "3 producers per table; the consumers only, one session per kind and table.", "",
             "## Lag beside a writer idle past the consumers' rows", "",
             f"A writer latches a key far past every consumer's rows and sits idle in its transaction for "
             f"{IDLE_SECONDS} s at a time. Lag is from a row's commit to its delivery.", ""]
    r = lambda a, b: "–" if not a or not b else f"{a / b:.2f}"  # noqa: E731
    for mode in result["idle"]:
        lines += [f"### `pgkvx.scan_mode = {mode}`", "",
                  "| consumer | lag p50 ms latched: alone / beside idle | ratio | lag p99 ms latched: alone / beside "
                  "idle | ratio | lag p50 / p99 ms plain, beside idle | skipped latched / plain |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        alone = {(x["table"], x["kind"]): x for x in result["modes"][mode]}
        beside = {(x["table"], x["kind"]): x for x in result["idle"][mode]}
        for kind in CONSUMERS:
            a, b, p = alone[("nb_latched", kind)], beside[("nb_latched", kind)], beside[("nb_plain", kind)]
            lines.append(f"| {kind} | {ms(a['lag_p50_ms'])} / {ms(b['lag_p50_ms'])} | "
                         f"{r(b['lag_p50_ms'], a['lag_p50_ms'])} | {ms(a['lag_p99_ms'])} / {ms(b['lag_p99_ms'])} | "
                         f"{r(b['lag_p99_ms'], a['lag_p99_ms'])} | {ms(p['lag_p50_ms'])} / {ms(p['lag_p99_ms'])} | "
                         f"{b['skipped']} / {p['skipped']} |")
        lines.append("")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--modes", default="optimistic,fenced")
    ap.add_argument("--idle-writer", action="store_true",
                    help="consumers only, alone and beside a writer idle past their rows")
    ap.add_argument("--out", default=f"{common.BENCH}/results")
    return ap.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    setup()
    with common.connect() as c:
        server = c.execute("SHOW server_version").fetchone()[0]
    result = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "server": server, "git": common.git_head(),
              "seconds": args.seconds, "modes": {}}
    if args.idle_writer:
        result["idle"] = {}
    for mode in args.modes.split(","):
        result["modes"][mode] = phase(mode, args.seconds, False if args.idle_writer else None)
        setup()
        if args.idle_writer:
            result["idle"][mode] = phase(mode, args.seconds, True)
            setup()
    kind = "-idle-writer" if args.idle_writer else ""
    started, base = common.report_base(argparse.Namespace(out=args.out, replica_delay=None, durable=False),
                                       f"-pg{server.split('.')[0]}-neighbours{kind}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result) + "\n")
    common.log(f"wrote {base}.md")
    print(markdown(result))
    runs = [*result["modes"].values(), *result.get("idle", {}).values()]
    plain_skips = sum(r.get("skipped", 0) for rows in runs for r in rows if r["table"] == "nb_plain")
    latched_bad = sum(r.get("skipped", 0) + r.get("duplicates", 0) for rows in runs
                      for r in rows if r["table"] == "nb_latched")
    if plain_skips == 0:
        common.log("the plain table's consumers skipped nothing: this run proves nothing about skips")
    return 1 if latched_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
