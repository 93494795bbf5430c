"""The two halves of the pg_upgrade test (tests/upgrade/run runs them).

before: on the old server, a database with a latched gapless table, an
        identity-keyed gapless table and a partitioned latched table, with
        rows; what a user would compare afterwards is saved to --state.
after:  on the upgraded server, the same registrations, key defaults,
        identities, rows and sequence positions; then, on each table, a
        writer held in flight below one that committed, and a consumer
        reading past its cursor.  Protected, the consumer waits and gets
        both rows; with pgkvx.scan_mode = off it skips the held one — which
        shows the race is real, so the protected result means something.
"""
import argparse
import json
import sys
import threading
import time

import psycopg

DB = "upgrade_app"

SETUP = """
CREATE EXTENSION pgkvx;
CREATE TABLE events (id bigserial PRIMARY KEY, payload text NOT NULL);
SELECT pgkvx.enable('events', gapless => true);
CREATE TABLE outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload text NOT NULL);
SELECT pgkvx.enable('outbox', gapless => true);
CREATE TABLE parted (id bigint PRIMARY KEY, payload text NOT NULL) PARTITION BY RANGE (id);
CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (1) TO (1000);
CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (1000) TO (2000);
CREATE TABLE parted_3 PARTITION OF parted FOR VALUES FROM (2000) TO (3000);
CREATE TABLE parted_4 PARTITION OF parted FOR VALUES FROM (3000) TO (4000);
SELECT pgkvx.enable('parted');
INSERT INTO events (payload) SELECT 'old ' || g FROM generate_series(1, 5) g;
INSERT INTO outbox (payload) SELECT 'old ' || g FROM generate_series(1, 5) g;
INSERT INTO parted SELECT g, 'old ' || g FROM generate_series(1, 5) g;
"""


def connect(args, dbname=DB):
    return psycopg.connect(host=args.host, port=args.port, user="postgres", dbname=dbname, autocommit=True,
                           options="-c statement_timeout=60s")


def state(c):
    """What must come through the upgrade unchanged."""
    q = lambda sql: [list(map(str, r)) for r in c.execute(sql).fetchall()]  # noqa: E731
    return {
        "extension": q("SELECT extversion FROM pg_extension WHERE extname = 'pgkvx'"),
        "registrations": q("SELECT * FROM pgkvx.tables ORDER BY 1"),
        "key columns": q("""SELECT c.relname, a.attname, a.attidentity, pg_get_expr(d.adbin, d.adrelid)
                              FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'id'
                              LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
                             WHERE c.relname IN ('events', 'outbox', 'parted') ORDER BY 1"""),
        "rows": q("""SELECT 'events', id, payload FROM events UNION ALL SELECT 'outbox', id, payload FROM outbox
                     UNION ALL SELECT 'parted', id, payload FROM parted ORDER BY 1, 2"""),
        "sequences": q("SELECT sequencename, last_value FROM pg_sequences ORDER BY 1"),
        "exposures": q("SELECT * FROM pgkvx.check() ORDER BY 1"),
    }


def before(args):
    with connect(args, "postgres") as c:
        c.execute(f"CREATE DATABASE {DB}")
    with connect(args) as c:
        c.execute(SETUP)
        s = state(c)
    json.dump(s, open(args.state, "w"), indent=1)
    return "old cluster: 3 latched tables, 15 rows"


def wait_until(fn, what, timeout=60.0):
    end = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


def race(args, table, insert_held, insert_next, cursor, mode):
    """A writer draws a key and stays in flight; a second writer commits the
    next key; a consumer in `mode` reads past `cursor`.  Returns the keys
    the consumer got, and whether it had to wait for the first writer."""
    held, other, consumer = connect(args), connect(args), connect(args)
    try:
        held.execute("BEGIN")
        k1 = held.execute(insert_held).fetchone()[0]
        k2 = other.execute(insert_next).fetchone()[0]
        assert k2 > k1, (table, k1, k2)
        consumer.execute(f"SET pgkvx.scan_mode = {mode}")
        pid = consumer.info.backend_pid
        got = {}

        def read():
            got["rows"] = [r[0] for r in consumer.execute(
                f"SELECT id FROM {table} WHERE id > %s ORDER BY id LIMIT 10", (cursor,)).fetchall()]

        t = threading.Thread(target=read)
        t.start()
        waited = False
        end = time.monotonic() + 60
        while t.is_alive() and time.monotonic() < end:
            row = held.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row and row[0] == "Lock":
                waited = True
                break
            time.sleep(0.05)
        held.execute("COMMIT")
        t.join(60)
        assert not t.is_alive(), f"{table}: the consumer never finished"
        return got["rows"], waited, (k1, k2)
    finally:
        for c in (held, other, consumer):
            c.close()


def after(args):
    with connect(args) as c:
        old = json.load(open(args.state))
        new = state(c)
    for what in old:
        assert old[what] == new[what], f"{what} changed by the upgrade:\n  before {old[what]}\n  after  {new[what]}"
    cases = [
        ("events", "INSERT INTO events (payload) VALUES ('held') RETURNING id",
         "INSERT INTO events (payload) VALUES ('next') RETURNING id"),
        ("outbox", "INSERT INTO outbox (payload) VALUES ('held') RETURNING id",
         "INSERT INTO outbox (payload) VALUES ('next') RETURNING id"),
        # keys given, not read (a read of max(id) would wait for the held
        # writer): the last key of one partition held, the first of the next
        # committed, so that every race crosses a partition boundary
        ("parted", "INSERT INTO parted VALUES ({round} * 1000 + 999, 'held') RETURNING id",
         "INSERT INTO parted VALUES ({round} * 1000 + 1000, 'next') RETURNING id"),
    ]
    skipped = 0
    for table, held_sql, next_sql in cases:
        for rnd, mode in enumerate(("off", "optimistic", "fenced")):
            with connect(args) as c:
                cursor = c.execute(f"SELECT max(id) FROM {table}").fetchone()[0]
            rows, waited, (k1, k2) = race(args, table, held_sql.format(round=rnd), next_sql.format(round=rnd),
                                          cursor, mode)
            if mode == "off":
                assert rows == [k2], f"{table}: unprotected, the race should skip {k1}: got {rows}"
                skipped += 1
            else:
                assert waited, f"{table} ({mode}): the consumer did not wait for the writer of {k1}"
                assert rows == [k1, k2], f"{table} ({mode}): expected [{k1}, {k2}], got {rows}"
    return (f"registrations, defaults, identities, rows and sequences unchanged; on 18, protected consumers "
            f"got every row of 3 tables in 2 modes (unprotected, {skipped} of 3 skipped a row)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("phase", choices=["before", "after"])
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--state", required=True)
    args = p.parse_args()
    try:
        print((before if args.phase == "before" else after)(args))
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
