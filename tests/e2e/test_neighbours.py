"""Every other read of a busy latched table behaves as on a plain one, and
every consumer shape keeps its promise without failing.

Three producers commit 1-3 rows at a time into a latched gapless table,
drawing keys in one order and committing in another.  Beside them run the
reads an application makes of the same table -- newest first, `max(id)`, a
count beside a max, the newest rows joined to a lookup table, a REPEATABLE
READ report -- which are no tails: they must never fail and never wait for
a writer (they run as plain PostgreSQL).  And the consumers -- a tail
joined to a lookup table, a cursor read from an offsets table in the same
statement (with and without FOR UPDATE), a FOR UPDATE batch, a relay's
DELETE ... RETURNING, and a REPEATABLE READ transaction whose first
statement is the poll -- in READ COMMITTED never fail because the table is
busy, and none of them skips a row.  Both scan modes.
"""
import random
import threading
import time

import psycopg
import pytest

from conftest import connect, connect_in_mode

SECONDS = 3.0
BATCH = 20


def setup_tables(conn, table):
    conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_kinds, {table}_offsets")
    conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, kind int NOT NULL, payload text)")
    conn.execute(f"SELECT pgkvx.enable('{table}', gapless => true)")
    conn.execute(f"CREATE TABLE {table}_kinds (kind int PRIMARY KEY, name text)")
    conn.execute(f"INSERT INTO {table}_kinds SELECT g, 'kind ' || g FROM generate_series(0, 2) g")
    conn.execute(f"CREATE TABLE {table}_offsets (name text PRIMARY KEY, c bigint NOT NULL)")


class Run:
    """Producers committing out of key order until `stop` is set."""

    def __init__(self, db, table, producers=3):
        self.db, self.table = db, table
        self.stop = threading.Event()
        self.committed = set()
        self.lock = threading.Lock()
        self.errors = []
        self.threads = [threading.Thread(target=self.produce, args=(i,)) for i in range(producers)]

    def produce(self, seed):
        rnd = random.Random(seed)
        try:
            with connect(self.db, autocommit=False) as c:
                while not self.stop.is_set():
                    ids = [c.execute(f"INSERT INTO {self.table} (kind, payload) VALUES (%s, 'p') RETURNING id",
                                     (rnd.randrange(3),)).fetchone()[0] for _ in range(rnd.randint(1, 3))]
                    time.sleep(rnd.random() * 0.003)
                    c.commit()
                    with self.lock:
                        self.committed.update(ids)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def run_readers(run, readers, seconds=SECONDS):
    """Runs each reader (name -> function of a stop event returning its
    result) in a thread of its own while the producers write; returns the
    readers' results and the errors they met, by reader, as SQLSTATEs."""
    results, failures = {}, {}
    stop = threading.Event()

    def go(name, fn):
        try:
            results[name] = fn(stop)
        except Exception as e:  # noqa: BLE001 - reported by the test
            failures.setdefault(name, []).append(repr(e))

    threads = [threading.Thread(target=go, args=kv) for kv in readers.items()]
    with run:
        for t in threads:
            t.start()
        time.sleep(seconds)
    # The producers have stopped: consumers drain what is left, then end.
    stop.set()
    for t in threads:
        t.join()
    assert not run.errors, run.errors
    return results, failures


def repeat(db, mode, stmts, stop, isolation=None):
    """Runs `stmts` (one transaction) until stopped: the SQLSTATEs of the
    errors met, and each statement's last rows."""
    errors, rows = [], None
    with connect_in_mode(db, mode, autocommit=isolation is None) as c:
        if isolation:
            c.isolation_level = isolation
        runs = 0
        while not stop.is_set() or runs == 0:
            runs += 1
            try:
                rows = [c.execute(s).fetchall() for s in stmts]
                if isolation:
                    c.commit()
            except psycopg.Error as e:
                errors.append(e.sqlstate)
                if isolation:
                    c.rollback()
    return {"errors": errors, "runs": runs, "rows": rows}


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_reads_that_are_no_tail_never_fail_or_wait(db, conn, mode):
    t = f"nb_plain_{mode}"
    setup_tables(conn, t)
    conn.execute(f"INSERT INTO {t} (kind) SELECT g % 3 FROM generate_series(1, 50) g")
    kinds = {
        "newest": [f"SELECT id FROM {t} ORDER BY id DESC LIMIT 20"],
        "max": [f"SELECT max(id) FROM {t}"],
        "count_max": [f"SELECT count(*) FROM {t} WHERE id > (SELECT max(id) - 10 FROM {t})"],
        "newest_joined": [f"SELECT e.id, k.name FROM {t} e JOIN {t}_kinds k USING (kind) ORDER BY e.id DESC LIMIT 20"],
    }
    readers = {name: (lambda stop, s=stmts: repeat(db, mode, s, stop)) for name, stmts in kinds.items()}
    readers["rr_report"] = lambda stop: repeat(
        db, mode, [f"SELECT count(*) FROM {t}", f"SELECT id FROM {t} ORDER BY id DESC LIMIT 20", f"SELECT max(id) FROM {t}"],
        stop, isolation=psycopg.IsolationLevel.REPEATABLE_READ)
    with connect(db) as c:
        before = dict(c.execute("SELECT stat, value FROM pgkvx.stats()").fetchall())
    results, failures = run_readers(Run(db, t), readers)
    assert not failures, failures
    for name, r in results.items():
        assert r["errors"] == [], f"{name} ({mode}) failed: {r['errors'][:5]} of {r['runs']} runs"
        assert r["runs"] > 5, f"{name} ran only {r['runs']} times"
    newest = [row[0] for row in results["newest"]["rows"][0]]
    assert len(newest) == 20 and newest == sorted(newest, reverse=True)
    report = results["rr_report"]["rows"]
    # One snapshot for the whole report: its newest row is its max.
    assert report[1][0][0] == report[2][0][0]
    with connect(db) as c:
        after = dict(c.execute("SELECT stat, value FROM pgkvx.stats()").fetchall())
        # None of them was a guarded read: they never wait for a writer.
        assert after["serialization_failures"] == before["serialization_failures"]
        plan = "\n".join(r[0] for r in c.execute(f"EXPLAIN (COSTS OFF) {kinds['newest'][0]}"))
        assert "PgkvxLimitScan" not in plan, plan


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_retention_deletes_never_fail(db, conn, mode):
    t = f"nb_ret_{mode}"
    setup_tables(conn, t)
    conn.execute(f"INSERT INTO {t} (kind) SELECT g % 3 FROM generate_series(1, 200) g")
    readers = {"retention": lambda stop: repeat(
        db, mode, [f"DELETE FROM {t} WHERE id < (SELECT min(id) + 5 FROM {t}) RETURNING id"], stop)}
    results, failures = run_readers(Run(db, t), readers)
    assert not failures, failures
    r = results["retention"]
    assert r["errors"] == [], r["errors"][:5]
    assert conn.execute(f"SELECT count(*) FROM {t} WHERE id <= 10").fetchone()[0] == 0, "retention deleted nothing"


def consume(db, mode, t, shape, stop, isolation=None):
    """A consumer of `shape` from cursor 0 until stopped and then drained:
    the ids it got, in order, and the SQLSTATEs it met."""
    got, errors = [], []
    name = f"{shape}-{mode}-{isolation or 'rc'}"
    with connect_in_mode(db, mode, autocommit=False) as c:
        if isolation:
            c.isolation_level = isolation
        c.execute(f"INSERT INTO {t}_offsets VALUES (%s, 0) ON CONFLICT (name) DO UPDATE SET c = 0", (name,))
        c.commit()
        cursor, idle = 0, 0
        while idle < 3:
            queries = {
                "join": (f"SELECT e.id FROM {t} e JOIN {t}_kinds k USING (kind) WHERE e.id > %(c)s "
                         f"ORDER BY e.id LIMIT {BATCH}"),
                "table_cursor": (f"SELECT id FROM {t} WHERE id > (SELECT c FROM {t}_offsets WHERE name = %(n)s) "
                                 f"ORDER BY id LIMIT {BATCH}"),
                "cte_for_update": (f"WITH o AS (SELECT c FROM {t}_offsets WHERE name = %(n)s FOR UPDATE) "
                                   f"SELECT e.id FROM {t} e, o WHERE e.id > o.c ORDER BY e.id LIMIT {BATCH}"),
                "for_update": f"SELECT id FROM {t} WHERE id > %(c)s ORDER BY id LIMIT {BATCH} FOR UPDATE",
            }
            try:
                ids = [r[0] for r in c.execute(queries[shape], {"c": cursor, "n": name})]
                if ids:
                    assert ids == sorted(ids) and ids[0] > cursor, (cursor, ids)
                    cursor = ids[-1]
                    got.extend(ids)
                    c.execute(f"UPDATE {t}_offsets SET c = %s WHERE name = %s", (cursor, name))
                c.commit()
            except psycopg.Error as e:
                errors.append(e.sqlstate)
                c.rollback()
                continue
            if stop.is_set():
                idle = idle + 1 if not ids else 0
            elif not ids:
                time.sleep(0.001)
    return {"got": got, "errors": errors}


def relay(db, mode, t, stop):
    """An outbox relay deleting what it ships, from a cursor."""
    got, errors = [], []
    with connect_in_mode(db, mode) as c:
        cursor, idle = 0, 0
        while idle < 3:
            try:
                ids = sorted(r[0] for r in c.execute(
                    f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE id > %s ORDER BY id LIMIT {BATCH}) "
                    "RETURNING id", (cursor,)))
            except psycopg.Error as e:
                errors.append(e.sqlstate)
                continue
            if ids:
                cursor = ids[-1]
                got.extend(ids)
            if stop.is_set():
                idle = idle + 1 if not ids else 0
            elif not ids:
                time.sleep(0.001)
    return {"got": got, "errors": errors}


SHAPES = ["join", "table_cursor", "cte_for_update", "for_update"]


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_consumers_of_every_shape_never_fail_and_never_skip(db, conn, mode):
    t = f"nb_cons_{mode}"
    setup_tables(conn, t)
    readers = {s: (lambda stop, s=s: consume(db, mode, t, s, stop)) for s in SHAPES}
    readers["rr_first_poll"] = lambda stop: consume(
        db, mode, t, "cte_for_update", stop, isolation=psycopg.IsolationLevel.REPEATABLE_READ)
    run = Run(db, t)
    results, failures = run_readers(run, readers)
    assert not failures, failures
    assert len(run.committed) > 100, "the producers hardly wrote"
    for name, r in results.items():
        assert r["errors"] == [], f"{name} ({mode}): {len(r['errors'])} errors, first {r['errors'][:3]}"
        assert len(r["got"]) == len(set(r["got"])), f"{name} read a row twice"
        missing = run.committed - set(r["got"])
        assert not missing, f"{name} ({mode}) skipped {len(missing)} rows, e.g. {sorted(missing)[:5]}"


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_relay_deletes_never_fail_and_never_skip(db, conn, mode):
    t = f"nb_relay_{mode}"
    setup_tables(conn, t)
    run = Run(db, t)
    results, failures = run_readers(run, {"relay": lambda stop: relay(db, mode, t, stop)})
    assert not failures, failures
    r = results["relay"]
    assert r["errors"] == [], r["errors"][:5]
    assert len(run.committed) > 100
    missing = run.committed - set(r["got"])
    assert not missing, f"relay skipped {len(missing)} rows, e.g. {sorted(missing)[:5]}"
    assert conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0
