"""A fenced read whose bound a CTE computes fences when its scan starts.
By then other scans of the statement may have read at its snapshot, so it
cannot move: a tail stops before the first key of a writer in flight at it
(and reads that key next time), a scan that cannot stop early waits and,
when the writer committed, fails with 40001.  Shapes that once skipped a
row or showed one twice:
- more writers of the table during the wait than a fold could list;
- a second guarded scan of the same statement (another latched table);
- a bound from an init plan of a correlated subquery, changing per outer
  row;
- a materialized CTE read half before the scan fenced and half after."""
import threading

import psycopg
import pytest

from conftest import connect, wait_until

POLL = """WITH last AS (SELECT acked FROM {offsets} WHERE grp = 'g' FOR UPDATE)
          SELECT id FROM {t} WHERE id > (SELECT acked FROM last) AND id < 1000 ORDER BY id LIMIT 10"""


def setup_tail(c, t, offsets, *tables):
    for name in (t, *tables):
        c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable(%s)", (name,))
        c.execute(f"INSERT INTO {name} SELECT generate_series(1, 5)")
    c.execute(f"CREATE TABLE {offsets} (grp text PRIMARY KEY, acked int NOT NULL)")
    c.execute(f"INSERT INTO {offsets} VALUES ('g', 5)")


def run_waiting(db, sql, conn):
    """Runs `sql` fenced in a thread; returns (thread, result dict) once it
    waits for a lock.  The dict gets its rows, or its error."""
    res = {}
    c = connect(db)
    c.execute("SET pgkvx.scan_mode = fenced")
    (pid,) = c.execute("SELECT pg_backend_pid()").fetchone()

    def go():
        try:
            res["rows"] = c.execute(sql).fetchall()
        except psycopg.Error as e:
            res["error"] = e
        finally:
            c.close()
    t = threading.Thread(target=go)
    t.start()
    wait_until(lambda: conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone() == (True,), "the read to wait for the writer")
    return t, res


def poll(db, sql, mode="fenced"):
    with connect(db) as c:
        c.execute(f"SET pgkvx.scan_mode = {mode}")
        return c.execute(sql).fetchall()


def test_a_bounded_scan_waits_and_fails_rather_than_show_a_state_it_cannot(db, conn, table_name):
    """`id < 1000` bounds the span above: stopping early would look like
    the whole range.  The scan waits for the writer; it committed, and the
    statement's snapshot cannot show it: 40001, and the retry reads it."""
    offsets = f"{table_name}_off"
    setup_tail(conn, table_name, offsets)
    sql = POLL.format(offsets=offsets, t=table_name)
    with connect(db, autocommit=False) as p:
        p.execute(f"INSERT INTO {table_name} VALUES (10)")
        conn.execute(f"INSERT INTO {table_name} VALUES (11)")
        t, res = run_waiting(db, sql, conn)
        # More writers of the table during the wait than a fold could list.
        conn.execute(f"DO $$ BEGIN FOR i IN 1..9000 LOOP INSERT INTO {table_name} VALUES (100000 + i); "
                     "COMMIT; END LOOP; END $$")
        p.commit()
        t.join(timeout=120)
    assert isinstance(res.get("error"), psycopg.errors.SerializationFailure), res
    assert [r[0] for r in poll(db, sql)] == [10, 11]


def test_a_tail_stops_before_a_writer_in_flight_and_reads_its_row_next_time(db, conn, table_name):
    offsets = f"{table_name}_off"
    setup_tail(conn, table_name, offsets)
    sql = f"""WITH last AS (SELECT acked FROM {offsets} WHERE grp = 'g' FOR UPDATE)
              SELECT id FROM {table_name} WHERE id > (SELECT acked FROM last) ORDER BY id LIMIT 10"""
    conn.execute(f"INSERT INTO {table_name} VALUES (7)")
    with connect(db, autocommit=False) as p:
        p.execute(f"INSERT INTO {table_name} VALUES (10)")
        conn.execute(f"INSERT INTO {table_name} VALUES (11)")
        # 11 committed behind 10 in flight: the read stops before 10.
        assert [r[0] for r in poll(db, sql)] == [7]
        p.commit()
    assert [r[0] for r in poll(db, sql)] == [7, 10, 11]


@pytest.mark.parametrize("ends", ["commit", "rollback"])
def test_two_guarded_scans_with_bounds_from_a_cte_skip_nothing(db, conn, table_name, ends):
    ta, tb, offsets = f"{table_name}_a", f"{table_name}_b", f"{table_name}_off"
    setup_tail(conn, ta, offsets, tb)
    sql = f"""WITH last AS (SELECT acked FROM {offsets} WHERE grp = 'g' FOR UPDATE)
              (SELECT 'a' AS t, id FROM {ta} WHERE id > (SELECT acked FROM last) ORDER BY id LIMIT 10)
              UNION ALL
              (SELECT 'b', id FROM {tb} WHERE id > (SELECT acked FROM last) ORDER BY id LIMIT 10)"""
    with connect(db, autocommit=False) as p, connect(db, autocommit=False) as wb, \
            connect(db, autocommit=False) as x:
        p.execute(f"INSERT INTO {ta} VALUES (10)")
        t, res = run_waiting(db, sql, conn)
        wb.execute("SELECT pg_current_xact_id()")
        x.execute("SELECT pg_current_xact_id()")
        x.execute(f"INSERT INTO {tb} VALUES (20)")
        wb.execute(f"INSERT INTO {tb} VALUES (21)")
        wb.commit()
        p.commit() if ends == "commit" else p.rollback()
        t.join(timeout=2)
        x.commit()
    t.join(timeout=120)
    # Each branch fences when its scan starts, from the cursor in the CTE,
    # and waited for 10's writer.  Two latched tables: no scan may stop
    # before a writer, so one that committed during the wait is a conflict
    # the statement's snapshot cannot repair: 40001, and a retry reads it.
    if ends == "commit":
        assert isinstance(res.get("error"), psycopg.errors.SerializationFailure), res
    else:
        rows = res["rows"]
        assert ("a", 10) not in rows, rows
        # Showing tb's 21 while its 20 (in flight before) hides would skip 20.
        assert ("b", 21) not in rows or ("b", 20) in rows, rows
    again = poll(db, sql)
    assert (("a", 10) in again) == (ends == "commit") and ("b", 20) in again and ("b", 21) in again, again


def test_a_bound_from_a_correlated_subquery_is_fenced_for_every_outer_row(db, conn, table_name):
    conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable(%s)", (table_name,))
    conn.execute(f"INSERT INTO {table_name} SELECT generate_series(1, 5)")
    sql = f"""SELECT o.c, (SELECT array_agg(id) FROM
                 (SELECT id FROM {table_name} WHERE id > (SELECT o.c) ORDER BY id LIMIT 10) s)
              FROM (VALUES (100), (5)) o(c) ORDER BY o.c"""
    with connect(db, autocommit=False) as p:
        p.execute(f"INSERT INTO {table_name} VALUES (10)")
        conn.execute(f"INSERT INTO {table_name} VALUES (11)")
        # A subquery's init plan: fenced at executor start, on every key
        # (the bound is not known then), so it waits for the writer.
        t, res = run_waiting(db, sql, conn)
        p.commit()
    t.join(timeout=120)
    assert res["rows"] == [(5, [10, 11]), (100, None)]


def test_a_materialized_cte_read_before_and_after_the_fence_sees_each_row_once(db, conn, table_name):
    """The CTE's scan is half read when the tail's scan fences; a writer
    of the tail also moves a row of the CTE's table to another page and
    commits.  Every expression reads one snapshot: row 2 once, 3000 rows."""
    plain, tail = f"{table_name}_plain", f"{table_name}_tail"
    conn.execute(f"CREATE TABLE {plain} (id int PRIMARY KEY, pad text)")
    conn.execute(f"INSERT INTO {plain} SELECT g, repeat('x', 200) FROM generate_series(1, 3000) g")
    conn.execute(f"CREATE TABLE {tail} (id int PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable(%s)", (tail,))
    conn.execute(f"INSERT INTO {tail} SELECT generate_series(1, 30)")
    sql = f"""WITH c AS MATERIALIZED (SELECT id, random() AS r FROM {plain})
              SELECT t.id, (SELECT count(*) FROM c WHERE c.id = 2), (SELECT count(*) FROM c)
              FROM {tail} t WHERE t.id > (SELECT id FROM c LIMIT 1) ORDER BY t.id LIMIT 20"""
    for mode in ("fenced", "optimistic"):
        with connect(db, autocommit=False) as w:
            w.execute(f"INSERT INTO {tail} VALUES (%s)", (1000 if mode == "fenced" else 1001,))
            w.execute(f"DELETE FROM {tail} WHERE id = 5")
            c = connect(db)
            c.execute(f"SET pgkvx.scan_mode = {mode}")
            (pid,) = c.execute("SELECT pg_backend_pid()").fetchone()
            res = {}

            def go():
                try:
                    res["rows"] = c.execute(sql).fetchall()
                except psycopg.Error as e:
                    res["error"] = e
            t = threading.Thread(target=go)
            t.start()
            wait_until(lambda: not t.is_alive() or conn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (True,),
                "the read to finish or wait")
            # Row 2's new version goes to another page.
            w.execute(f"UPDATE {plain} SET pad = repeat('y', 200) WHERE id = 2")
            w.commit()
            t.join(timeout=120)
            c.close()
        # random() makes the statement one that cannot run twice: fenced in
        # both modes.  5's delete was in flight at the statement's snapshot,
        # which the CTE had already read at: the scan cannot show it, so the
        # tail stops before it (the next poll reads on) -- at that one
        # snapshot, every row of the CTE once.
        assert "error" not in res, (mode, res)
        assert res["rows"] == [(i, 1, 3000) for i in (2, 3, 4)], (mode, res)
        rows = poll(db, sql, mode)
        assert {(r[1], r[2]) for r in rows} == {(1, 3000)}, (mode, rows[:3])
        assert [r[0] for r in rows] == [i for i in range(2, 23) if i != 5], (mode, rows)
        conn.execute(f"INSERT INTO {tail} VALUES (5) ON CONFLICT DO NOTHING")


def validations(c):
    return c.execute("SELECT value FROM pgkvx.stats() WHERE stat = 'validations'").fetchone()[0]


def plan_value(plan, label):
    """`label` of the PgkvxLimitScan node in an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, dict):
        if plan.get("Custom Plan Provider") == "PgkvxLimitScan" and label in plan:
            return plan[label]
        plan = list(plan.values())
    if isinstance(plan, list):
        for p in plan:
            found = plan_value(p, label)
            if found is not None:
                return found
    return None


def test_stats_count_each_validation_of_a_scan_fenced_at_start_once(db, conn, table_name):
    """pgkvx.stats() counts the validations EXPLAIN ANALYZE shows: a scan
    fenced when it started met a writer in flight, waited for it (it rolled
    back) and checked again -- two validations, counted once each."""
    offsets = f"{table_name}_off"
    setup_tail(conn, table_name, offsets)
    sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + POLL.format(offsets=offsets, t=table_name)
    with connect(db, autocommit=False) as p:
        p.execute(f"INSERT INTO {table_name} VALUES (10)")
        before = validations(conn)
        t, res = run_waiting(db, sql, conn)
        p.rollback()
        t.join(timeout=120)
    after = validations(conn)
    assert "rows" in res, res
    shown = plan_value(res["rows"][0][0], "Validations")
    assert plan_value(res["rows"][0][0], "Waits") == 1
    assert (shown, after - before) == (2, 2)
