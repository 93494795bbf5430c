"""After waiting, a read takes a fresh snapshot -- a state PostgreSQL itself
could show -- however many xids the cluster assigned meanwhile, and
returns every row it must; a REPEATABLE READ transaction whose first read
waited reads at that state from then on."""
from conftest import connect, stats, wait_until


def test_an_old_cursor_snapshot_waits_once_however_many_xids_came_since(db, table_name):
    """A cursor's snapshot taken long ago, with thousands of transactions
    since: the read waits for the writer in flight at it, then reads at one
    fresh snapshot, where every commit before it shows -- the writer's row
    and the rows committed meanwhile alike."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    with connect(db, autocommit=False) as w, connect(db, autocommit=False) as r, connect(db) as busy:
        w.execute(f"INSERT INTO {table_name} (v) VALUES ('late')")        # id 1, in flight
        busy.execute(f"INSERT INTO {table_name} (v) VALUES ('early')")    # id 2, committed
        r.execute(f"DECLARE c CURSOR FOR SELECT id FROM {table_name} WHERE id > 0 ORDER BY id LIMIT 10")
        busy.execute(f"INSERT INTO {table_name} (v) VALUES ('after')")    # id 3, after the snapshot
        before = stats(busy)["fresh_snapshots"]
        # More top-level transactions since the cursor's snapshot than a
        # pull-in could ever list one by one.
        busy.execute("DO $$ BEGIN FOR i IN 1..20000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$")
        w.commit()
        assert r.execute("FETCH ALL FROM c").fetchall() == [(1,), (2,), (3,)]
        r.commit()
        assert stats(busy)["fresh_snapshots"] == before + 1
    with connect(db) as c:
        c.execute(f"DROP TABLE {table_name}")


def _rr_first_read_adopts_a_writer(db, table_name, burn=2000):
    """A REPEATABLE READ transaction whose first read waited for a writer
    while `burn` xids were assigned elsewhere; returns the reader, still in
    its transaction, and the writer's id."""
    w = connect(db, autocommit=False)
    r = connect(db, autocommit=False)
    (late,) = w.execute(f"INSERT INTO {table_name} (v) VALUES ('late') RETURNING id").fetchone()
    # A row committed past the writer's: the read returns it, so it waits.
    with connect(db) as a:
        a.execute(f"INSERT INTO {table_name} (v) VALUES ('after')")
    import threading
    got = {}
    t = threading.Thread(target=lambda: got.update(rows=r.execute(
        f"SELECT id FROM {table_name} WHERE id > 0 ORDER BY id LIMIT 50").fetchall()))
    (pid,) = r.execute("SELECT pg_backend_pid()").fetchone()
    r.rollback()
    r.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    t.start()
    with connect(db) as busy:
        # The xids are assigned while the read waits for the writer.
        wait_until(lambda: busy.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                        (pid,)).fetchone() == (True,), "the first read to wait")
        busy.execute(f"DO $$ BEGIN FOR i IN 1..{burn} LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$")
    w.commit()
    w.close()
    t.join(timeout=60)
    assert (late,) in got["rows"]
    return r, late


def test_an_adopted_repeatable_read_snapshot_serves_parallel_workers_and_exports(db, table_name):
    """The snapshot a REPEATABLE READ transaction adopts stays within what
    PostgreSQL copies a transaction snapshot into: a parallel worker and an
    importing session get it whole (it once held every xid assigned during
    the wait, and a parallel worker overran its array)."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
        c.execute(f"CREATE TABLE {table_name}_plain AS SELECT g AS x FROM generate_series(1, 1000) g")
    r, late = _rr_first_read_adopts_a_writer(db, table_name)
    try:
        # renamed in PostgreSQL 16
        r.execute("SET %s = on" % ("force_parallel_mode" if r.info.server_version < 160000 else "debug_parallel_query"))
        assert r.execute(f"SELECT count(*) FROM {table_name}_plain").fetchone() == (1000,)
        assert (late,) in r.execute(f"SELECT id FROM {table_name}").fetchall()
        (name,) = r.execute("SELECT pg_export_snapshot()").fetchone()
        with connect(db, autocommit=False) as other:
            other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            other.execute("SET TRANSACTION SNAPSHOT %s" % psycopg_literal(name))
            assert (late,) in other.execute(f"SELECT id FROM {table_name}").fetchall()
            other.rollback()
        r.rollback()
    finally:
        r.close()
    with connect(db) as c:
        c.execute("SELECT 1")  # the server is still up
        c.execute(f"DROP TABLE {table_name}, {table_name}_plain")


def psycopg_literal(s):
    return "'" + s.replace("'", "''") + "'"


def test_a_cursor_declared_first_does_not_move_a_snapshot_others_read_at(db, table_name):
    """A cursor declared first in a REPEATABLE READ transaction validates
    at its first FETCH; when another statement read at the snapshot in
    between, the snapshot must not move under it: the FETCH fails with
    40001 instead of showing a row the other statement did not see."""
    import psycopg
    import pytest
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, v text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
        c.execute(f"INSERT INTO {table_name} (v) SELECT 'old' FROM generate_series(1, 5)")
    with connect(db, autocommit=False) as w, connect(db, autocommit=False) as r:
        w.execute(f"INSERT INTO {table_name} (v) VALUES ('in flight')")
        # Committed past the writer's row: the cursor returns it, so it
        # must wait for the writer.
        with connect(db) as a:
            a.execute(f"INSERT INTO {table_name} (v) VALUES ('after')")
        r.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        r.execute(f"DECLARE c NO SCROLL CURSOR FOR SELECT id FROM {table_name} WHERE id > 0 ORDER BY id LIMIT 50")
        (before,) = r.execute(f"SELECT count(*) FROM {table_name}").fetchone()
        w.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            r.execute("FETCH ALL FROM c").fetchall()
        r.rollback()
        assert before == 6
    with connect(db) as c:
        c.execute(f"DROP TABLE {table_name}")
