"""Who blocks the head: pgkvx.head_blockers on composite and descending
keys, its bounded count of the rows behind, and EXPLAIN ANALYZE naming the
writer a read waited for -- with keys hidden from a role that may not read
every row."""
import threading

import pytest

from conftest import connect, wait_until

GUARD = 120  # seconds: hang guard for reads that a commit must end


def blockers(c, table, after=None):
    return c.execute("""SELECT rank, span, rows_behind, rows_behind_capped, holder_pid
                          FROM pgkvx.head_blockers(%s, %s) ORDER BY rank""", (table, after)).fetchall()


def test_composite_key_cursor(db, table_name):
    with connect(db) as c, connect(db, autocommit=False) as w:
        c.execute(f"CREATE TABLE {table_name} (tenant int, id int, PRIMARY KEY (tenant, id))")
        c.execute(f"SELECT pgkvx.enable('{table_name}')")
        c.execute(f"INSERT INTO {table_name} SELECT t, g FROM generate_series(1, 2) t, generate_series(1, 5) g")
        w.execute(f"INSERT INTO {table_name} VALUES (1, 6), (2, 0)")
        pid = w.info.backend_pid
        # From the start the head is (1,6); rows (2,1..5) sit behind it and
        # (2,0)'s writer is the same transaction.
        assert blockers(c, table_name) == [(1, "[(1,6)]", 5, False, pid)]
        # Past the prefix (1): every key of tenant 1 is behind the cursor.
        assert blockers(c, table_name, "(1)") == [(1, "[(2,0)]", 5, False, pid)]
        assert blockers(c, table_name, "(2,0)") == []
        w.rollback()
        assert blockers(c, table_name) == []


def test_descending_key(db, table_name):
    with connect(db) as c, connect(db, autocommit=False) as w:
        c.execute(f"CREATE TABLE {table_name} (id int NOT NULL)")
        c.execute(f"CREATE UNIQUE INDEX {table_name}_desc ON {table_name} (id DESC)")
        c.execute(f"SELECT pgkvx.enable('{table_name}', '{table_name}_desc')")
        c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(1, 10) g")
        w.execute(f"INSERT INTO {table_name} VALUES (5 + 100), (0)")
        w.execute(f"DELETE FROM {table_name} WHERE id = 6")
        pid = w.info.backend_pid
        # Key order is descending: 105 comes first, then 6, then 0.
        assert blockers(c, table_name) == [(1, "[105]", 10, False, pid)]
        # Past 7 (that is, below it) the first latched key is 6, and 6..1 are
        # behind it (6 still committed: its delete is not).
        assert blockers(c, table_name, "7") == [(1, "[6]", 6, False, pid)]
        w.rollback()


def test_rows_behind_is_counted_up_to_a_bound(db, table_name):
    with connect(db) as c, connect(db, autocommit=False) as w:
        c.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
        c.execute(f"SELECT pgkvx.enable('{table_name}')")
        w.execute(f"INSERT INTO {table_name} VALUES (1)")
        c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(2, 10100) g")
        assert blockers(c, table_name) == [(1, "[1]", 10000, True, w.info.backend_pid)]
        w.rollback()


def explain_waiting(db, sql, role=None):
    """EXPLAIN ANALYZE of `sql` on its own session (as `role`): returns the
    thread and a list its plan lines land in."""
    out = []
    c = connect(db)

    def run():
        try:
            if role:
                c.execute(f"SET ROLE {role}")
            out.extend(r for (r,) in c.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"))
        except Exception as e:  # noqa: BLE001 - reported by the test
            out.append(e)
        finally:
            c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out, c.info.backend_pid


def waited_line(plan):
    assert all(isinstance(p, str) for p in plan), plan
    lines = [p.strip() for p in plan if "Waited For" in p]
    assert len(lines) == 1, plan
    return lines[0]


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_explain_names_the_writer_waited_for(db, table_name, mode):
    with connect(db) as c, connect(db, autocommit=False) as w:
        c.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
        c.execute(f"SELECT pgkvx.enable('{table_name}')")
        # 7, the writer's key, lies behind 9: a read returning 9 waits for it.
        c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(1, 5) g UNION ALL SELECT 9")
        w.execute(f"INSERT INTO {table_name} VALUES (7)")
        wpid, wxid = w.info.backend_pid, w.execute("SELECT txid_current()").fetchone()[0]
        c.execute(f"ALTER DATABASE {db} SET pgkvx.scan_mode = {mode}")
        try:
            t, plan, rpid = explain_waiting(db, f"SELECT id FROM {table_name} WHERE id > 3 ORDER BY id LIMIT 10")
            wait_until(lambda: c.execute("SELECT pg_blocking_pids(%s) = ARRAY[%s::int]", (rpid, wpid)).fetchone()[0],
                       "the read to wait for the writer")
            w.commit()
            t.join(GUARD)
        finally:
            c.execute(f"ALTER DATABASE {db} RESET pgkvx.scan_mode")
        assert not t.is_alive()
        assert waited_line(plan) == f"Waited For: pid {wpid} xid {wxid} at [7]"


def test_explain_hides_the_key_from_a_role_that_may_not_read_every_row(db, table_name):
    role = f"{table_name}_tenant"
    with connect(db) as c, connect(db, autocommit=False) as w:
        c.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, tenant text NOT NULL DEFAULT 'a')")
        c.execute(f"SELECT pgkvx.enable('{table_name}')")
        # 7, the writer's key, lies behind 9: a read returning 9 waits for it.
        c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(1, 5) g UNION ALL SELECT 9")
        c.execute(f"CREATE ROLE {role}")
        try:
            c.execute(f"GRANT SELECT ON {table_name} TO {role}")
            c.execute(f"ALTER TABLE {table_name} ENABLE ROW LEVEL SECURITY")
            c.execute(f"CREATE POLICY own ON {table_name} TO {role} USING (tenant = 'a')")
            w.execute(f"INSERT INTO {table_name} VALUES (7)")
            wpid = w.info.backend_pid
            t, plan, rpid = explain_waiting(db, f"SELECT id FROM {table_name} WHERE id > 3 ORDER BY id LIMIT 10",
                                            role=role)
            wait_until(lambda: c.execute("SELECT pg_blocking_pids(%s) = ARRAY[%s::int]", (rpid, wpid)).fetchone()[0],
                       "the read to wait for the writer")
            w.commit()
            t.join(GUARD)
            assert not t.is_alive()
            line = waited_line(plan)
            assert line.startswith(f"Waited For: pid {wpid} xid ") and line.endswith(" at (keys hidden)"), line
            assert "7" not in line.split(" at ")[1]
        finally:
            w.rollback()
            c.execute(f"DROP TABLE IF EXISTS {table_name}")
            c.execute(f"DROP ROLE IF EXISTS {role}")


def test_the_bound_holds_for_a_partitioned_table_and_partitions_answer_for_their_parent(db, table_name):
    """The bound on rows read is one per call, not one per partition; a
    partition asked about shows its parent's blockers and waits (latches
    and wake-ups are kept under the parent)."""
    with connect(db) as c, connect(db, autocommit=False) as w:
        c.execute(f"""CREATE TABLE {table_name} (id bigint PRIMARY KEY) PARTITION BY RANGE (id)""")
        for i in range(4):
            c.execute(f"""CREATE TABLE {table_name}_{i} PARTITION OF {table_name}
                          FOR VALUES FROM ({i * 10000}) TO ({(i + 1) * 10000})""")
        c.execute(f"SELECT pgkvx.enable('{table_name}')")
        w.execute(f"INSERT INTO {table_name} VALUES (0)")
        c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(1, 39999) g")
        pid = w.info.backend_pid
        assert blockers(c, table_name) == [(1, "[0]", 10000, True, pid)]
        # The partition holding the writer's row, and another one: both
        # answer with the parent's blocker, rows counted in themselves.
        assert blockers(c, f"{table_name}_0") == [(1, "[0]", 9999, False, pid)]
        assert blockers(c, f"{table_name}_2") == [(1, "[0]", 10000, True, pid)]
        w.rollback()
        # A read of the parent that waits for a writer counts under the parent;
        # its partitions report the same.
        w.execute(f"INSERT INTO {table_name} VALUES (0)")
        done = {}
        r = connect(db)
        t = threading.Thread(target=lambda: done.update(
            rows=r.execute(f"SELECT id FROM {table_name} WHERE id >= 0 ORDER BY id LIMIT 3").fetchall()))
        t.start()
        wait_until(lambda: c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                                     (r.info.backend_pid,)).fetchone() == (1,), "the read to wait")
        w.commit()
        t.join(timeout=GUARD)
        r.close()
        assert done["rows"] == [(0,), (1,), (2,)]
        parent = dict(c.execute("SELECT stat, value FROM pgkvx.stats(%s)", (table_name,)).fetchall())
        part = dict(c.execute("SELECT stat, value FROM pgkvx.stats(%s)", (f"{table_name}_1",)).fetchall())
        assert parent["read_waits"] >= 1 and part == parent, (parent, part)


def test_monitoring_never_waits_behind_the_lock_it_should_show(db, table_name):
    """A TRUNCATE in flight holds ACCESS EXCLUSIVE on a latched table: the
    views an operator opens then answer at once (lock_timeout would fire on
    any wait), for roles with and without a privilege on the table."""
    role = f"{table_name}_nopriv"
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
        c.execute(f"SELECT pgkvx.enable('{table_name}')")
        c.execute(f"INSERT INTO {table_name} SELECT g FROM generate_series(1, 10) g")
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f"GRANT USAGE ON SCHEMA pgkvx TO {role}")
        try:
            with connect(db, autocommit=False) as t:
                t.execute(f"TRUNCATE {table_name}")
                pid = t.info.backend_pid
                for who in (None, role):
                    # New sessions: nothing of the table cached.
                    with connect(db) as m:
                        if who:
                            m.execute(f"SET ROLE {who}")
                        m.execute("SET lock_timeout = '1ms'")
                        m.execute("SELECT * FROM pgkvx.latches").fetchall()
                        m.execute("SELECT * FROM pgkvx.ranges").fetchall()
                        m.execute("SELECT * FROM pgkvx.wait_stats()").fetchall()
                        m.execute("SELECT * FROM pgkvx.waiters").fetchall()
                        problems = m.execute("SELECT relid::text, problem FROM pgkvx.check()").fetchall()
                        if who is None:
                            assert (table_name, "locked by another transaction (DDL or TRUNCATE in progress): "
                                                "not checked now") in problems, problems
                        rows = m.execute("SELECT holder_pid, span FROM pgkvx.head_blockers").fetchall()
                        if who is None:
                            assert (pid, None) in rows, rows
                            assert [r[4] for r in blockers(m, table_name)] == [pid]
                            m.execute("SELECT * FROM pgkvx.stats(%s)", (table_name,)).fetchall()
                        else:
                            assert rows == []
                t.rollback()
        finally:
            c.execute(f"DROP OWNED BY {role}")
            c.execute(f"DROP ROLE {role}")
            c.execute(f"DROP TABLE {table_name}")
