"""A latched partitioned table under DDL: producers insert through the
parent (ids drawn gaplessly from its one sequence, rows spread over the
partitions by created_at), consumers tail the parent by id, and meanwhile
partitions are created, attached, detached (plainly and CONCURRENTLY) and
dropped.  No consumer may move its cursor past a row that is still in the
table at the end; afterwards nothing is left behind: no live latch, no
registry row but the parent's, and pgkvx.check() is clean."""
import random
import threading
import time

import psycopg
import pytest

from conftest import connect

DAY = 86400


def setup_table(c, name):
    c.execute(f"""CREATE TABLE {name} (id bigserial, created_at bigint NOT NULL, v text,
                                       PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)""")
    c.execute(f"ALTER SEQUENCE {name}_id_seq CACHE 1")
    for n in range(3):
        c.execute(f"CREATE TABLE {name}_{n} PARTITION OF {name} FOR VALUES FROM ({n * DAY}) TO ({(n + 1) * DAY})")
    c.execute(f"SELECT pgkvx.enable('{name}', gapless => true)")


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_tail_under_partition_ddl(db, mode):
    table = f"pev_{mode}"
    with connect(db) as c:
        setup_table(c, table)
    # Ranges producers may write into: partition number -> name.
    live = {n: f"{table}_{n}" for n in range(3)}
    live_lock = threading.Lock()
    stop = threading.Event()
    errors = []
    ddl_done = []

    def producer(seed):
        r = random.Random(seed)
        try:
            with connect(db, autocommit=False) as c:
                while not stop.is_set():
                    with live_lock:
                        parts = list(live)
                    n = r.choice(parts)
                    try:
                        for _ in range(r.randint(1, 3)):
                            c.execute(f"INSERT INTO {table} (created_at, v) VALUES (%s, 'x')",
                                      (n * DAY + r.randrange(DAY),))
                        time.sleep(r.random() * 0.004)
                        if r.random() < 0.1:
                            c.rollback()
                        else:
                            c.commit()
                    except (psycopg.errors.CheckViolation, psycopg.errors.UndefinedTable,
                            psycopg.errors.DeadlockDetected, psycopg.errors.ObjectInUse):
                        # The range went away under the producer (detached or
                        # dropped): its row has no partition to go to.
                        c.rollback()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    delivered = [[] for _ in range(2)]
    cursors = [0, 0]

    def consumer(i):
        try:
            with connect(db) as c:
                c.execute(f"SET pgkvx.scan_mode = {mode}")
                idle = 0
                while True:
                    rows = c.execute(f"SELECT id FROM {table} WHERE id > %s ORDER BY id LIMIT 7",
                                     (cursors[i],)).fetchall()
                    for (id_,) in rows:
                        assert id_ > cursors[i]
                        delivered[i].append(id_)
                        cursors[i] = id_
                    if not rows:
                        if stop.is_set() and ddl_done:
                            idle += 1
                            if idle > 30:
                                return
                        time.sleep(0.001)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def ddl():
        r = random.Random(7)
        next_n = 3
        try:
            with connect(db) as c:
                for step in range(12):
                    time.sleep(0.05 + r.random() * 0.05)
                    kind = step % 4
                    n = next_n
                    next_n += 1
                    name = f"{table}_{n}"
                    if kind == 0:
                        c.execute(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({n * DAY}) TO ({(n + 1) * DAY})")
                    else:
                        c.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)")
                        c.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({n * DAY}) TO ({(n + 1) * DAY})")
                    with live_lock:
                        live[n] = name
                    time.sleep(0.05)
                    # Retire the oldest range: detach (three ways) and drop.
                    with live_lock:
                        old = min(live)
                        old_name = live.pop(old)
                    if kind == 1:
                        c.execute(f"ALTER TABLE {table} DETACH PARTITION {old_name} CONCURRENTLY")
                    elif kind == 2:
                        c.execute(f"ALTER TABLE {table} DETACH PARTITION {old_name}")
                    if kind in (1, 2):
                        c.execute(f"DROP TABLE {old_name}")
                    else:
                        c.execute(f"DROP TABLE {old_name}")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            ddl_done.append(True)

    threads = [threading.Thread(target=producer, args=(s,)) for s in range(4)]
    threads += [threading.Thread(target=consumer, args=(i,)) for i in range(2)]
    d = threading.Thread(target=ddl)
    for t in threads:
        t.start()
    d.start()
    d.join()
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with connect(db) as c:
        final = [r[0] for r in c.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]
        assert final, "producers wrote rows"
        for i in range(2):
            seen = set(delivered[i])
            assert len(seen) == len(delivered[i]), "no row twice"
            skipped = [k for k in final if k <= cursors[i] and k not in seen]
            assert not skipped, f"consumer {i} skipped {skipped[:10]}"
            assert cursors[i] >= final[-1], "consumers caught up"
        # Cleaned up without a restart.
        assert c.execute("SELECT count(*) FROM pgkvx.latches WHERE state = 'live'").fetchone()[0] == 0
        assert c.execute("SELECT relid::text FROM pgkvx.tables").fetchall() == [(table,)]
        assert c.execute("SELECT * FROM pgkvx.check()").fetchall() == []
        # Every partition left is latched under the parent.
        parts = c.execute("""SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                              WHERE i.inhparent = %s::regclass""", (table,)).fetchall()
        for (p,) in parts:
            trig = c.execute("""SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname)
                                  FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE 'zz_pgkvx%%'""",
                             (p,)).fetchone()[0]
            assert trig == "zz_pgkvx_latch:A,zz_pgkvx_latch_truncate:A", (p, trig)
        c.execute(f"DROP TABLE {table}")
        assert c.execute("SELECT count(*) FROM pgkvx.tables").fetchone()[0] == 0


def test_pg_dump_and_pg_restore_keep_the_registration():
    """pg_restore loads pgkvx.tables before it creates indexes: a
    registration naming the parent's primary key as a regclass made that
    COPY fail, and every registration of the database was lost."""
    import os
    import subprocess
    import tempfile

    from conftest import PG_BINDIR, scratch_database

    with scratch_database("e2e_part_dump_src") as src, scratch_database("e2e_part_dump_dst") as dst:
        with connect(src) as c:
            c.execute("CREATE EXTENSION pgkvx")
            c.execute("""CREATE TABLE pev (id bigserial, created_at date NOT NULL, v text,
                                           PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)""")
            c.execute("ALTER SEQUENCE pev_id_seq CACHE 1")
            c.execute("CREATE TABLE pev_2025 PARTITION OF pev FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')")
            c.execute("SELECT pgkvx.enable('pev', gapless => true)")
            c.execute("CREATE TABLE plain_ev (id bigserial PRIMARY KEY, v text)")
            c.execute("SELECT pgkvx.enable('plain_ev', gapless => true)")
            c.execute("INSERT INTO pev (created_at, v) VALUES ('2025-02-01', 'a'), ('2025-03-01', 'b')")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "dump")
            dump = subprocess.run([f"{PG_BINDIR}/pg_dump", "-Fc", "-f", path, "-d", src],
                                  capture_output=True, text=True)
            assert dump.returncode == 0, dump.stderr
            restore = subprocess.run([f"{PG_BINDIR}/pg_restore", "--exit-on-error", "-d", dst, path],
                                     capture_output=True, text=True)
            assert restore.returncode == 0, restore.stderr
        with connect(dst) as c:
            got = sorted(c.execute("SELECT relid::text, gapless FROM pgkvx.tables").fetchall())
            assert got == [("pev", True), ("plain_ev", True)]
            c.execute("INSERT INTO pev (created_at, v) VALUES ('2025-04-01', 'c')")
            assert [i for (i,) in c.execute("SELECT id FROM pev WHERE id > 0 ORDER BY id LIMIT 10")] == [1, 2, 3]
