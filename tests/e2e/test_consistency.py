"""A statement that waited reads one state some serial order produces.

The watermark shape: ids 1..7 committed and `hw = 7`;
writer X updates row 3 (the read waits for it); meanwhile Z inserts id 8
and commits, then Y, having seen 8, sets `hw = 8` and commits; then X
commits.  A consumer that trusts the watermark must never get `hw = 8`
without id 8 -- plain PostgreSQL never shows that -- in any mode, in a
REPEATABLE READ transaction that adopted the state, and with the watermark
in a second latched table read in no key order."""
import threading

import pytest

from conftest import connect, wait_until

READ = "SELECT (SELECT n FROM {hw}), array(SELECT id FROM {ev} WHERE id > 0 ORDER BY id LIMIT 100)"


def start_waiting(conn, c, what, fn):
    """Runs `fn()` on connection `c` in a thread and returns (thread, result)
    once `c`'s backend waits for a lock (or `fn` failed): `result` gets
    "out" or "error"."""
    pid = c.info.backend_pid
    res = {}

    def run():
        try:
            res["out"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            res["error"] = e
    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: "error" in res or conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (True,),
        what)
    assert "error" not in res, res
    return t, res


def setup(c, ev, hw, hw_latched):
    c.execute(f"CREATE TABLE {ev} (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)")
    c.execute("SELECT pgkvx.enable(%s)", (ev,))
    c.execute(f"INSERT INTO {ev} (id) SELECT generate_series(1, 7)")
    c.execute(f"CREATE TABLE {hw} (k int PRIMARY KEY, n int NOT NULL)")
    c.execute(f"INSERT INTO {hw} VALUES (1, 7)")
    if hw_latched:
        c.execute("SELECT pgkvx.enable(%s)", (hw,))


def race(db, conn, ev, hw, reader, *, mode, iso="read committed"):
    """Plays the race around `reader(c)`, run in a thread on a connection in
    `mode` and `iso`; returns what it returned and the connection (still
    open, in its transaction for REPEATABLE READ)."""
    c = connect(db, autocommit=iso == "read committed")
    c.execute(f"SET pgkvx.scan_mode = {mode}")
    if iso != "read committed":
        c.commit()
        # The reader's statement is the first of its transaction.
        c.execute(f"SET TRANSACTION ISOLATION LEVEL {iso}")
    with connect(db, autocommit=False) as x:
        x.execute(f"UPDATE {ev} SET v = v + 1 WHERE id = 3")
        t, res = start_waiting(conn, c, "the read to wait for X", lambda: reader(c))
        conn.execute(f"INSERT INTO {ev} (id) VALUES (8)")          # Z
        with connect(db, autocommit=False) as y:                     # Y saw 8
            assert y.execute(f"SELECT max(id) FROM {ev}").fetchone() == (8,)
            y.execute(f"UPDATE {hw} SET n = 8")
            y.commit()
        x.commit()
    t.join(timeout=120)
    assert "out" in res, res
    return res["out"], c


def cleanup(conn, ev, hw):
    conn.execute(f"DROP TABLE {ev}, {hw}")


@pytest.mark.parametrize("hw_latched", [False, True], ids=["plain-watermark", "latched-watermark"])
@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_a_watermark_never_shows_without_the_rows_it_saw(db, conn, table_name, mode, hw_latched):
    ev, hw = f"{table_name}_ev", f"{table_name}_hw"
    setup(conn, ev, hw, hw_latched)
    (n, ids), c = race(db, conn, ev, hw, lambda c: c.execute(READ.format(hw=hw, ev=ev)).fetchone(), mode=mode)
    c.close()
    assert n in (7, 8)
    assert n == 7 or 8 in ids, f"hw = {n} but ids {ids}: the watermark shows without the row it saw"
    assert ids[:7] == list(range(1, 8)), ids
    cleanup(conn, ev, hw)


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_a_repeatable_read_transaction_keeps_the_state_its_first_statement_read(db, conn, table_name, mode):
    """The first statement waited and moved the transaction's snapshot: the
    transaction reads at exactly the state that statement's rows came from."""
    ev, hw = f"{table_name}_ev", f"{table_name}_hw"
    setup(conn, ev, hw, False)
    (n, ids), c = race(db, conn, ev, hw, lambda c: c.execute(READ.format(hw=hw, ev=ev)).fetchone(),
                       mode=mode, iso="repeatable read")
    try:
        assert n == 7 or 8 in ids, (n, ids)
        # Later statements of the transaction: the same watermark, the
        # same rows, also read without the protocol.
        assert c.execute(f"SELECT n FROM {hw}").fetchone() == (n,)
        assert c.execute(f"SELECT array_agg(id ORDER BY id) FROM {ev}").fetchone() == (ids,)
        assert c.execute(READ.format(hw=hw, ev=ev)).fetchone() == (n, ids)
        c.rollback()
    finally:
        c.close()
    cleanup(conn, ev, hw)


def test_a_repeatable_read_first_statement_reading_no_other_table_keeps_its_state(db, conn, table_name):
    """A first statement reading only the stream, then the watermark: the
    watermark is the one of the state the stream was read at."""
    ev, hw = f"{table_name}_ev", f"{table_name}_hw"
    setup(conn, ev, hw, False)
    ids, c = race(db, conn, ev, hw,
                  lambda c: c.execute(f"SELECT array(SELECT id FROM {ev} WHERE id > 0 ORDER BY id LIMIT 100)")
                  .fetchone()[0], mode="optimistic", iso="repeatable read")
    try:
        (n,) = c.execute(f"SELECT n FROM {hw}").fetchone()
        assert n == 7 or 8 in ids, (n, ids)
        c.rollback()
    finally:
        c.close()
    cleanup(conn, ev, hw)


def test_a_tail_stops_before_a_writer_that_started_after_it_waited(db, conn, table_name):
    """After waiting for X the read takes a fresh snapshot; a writer W that
    started during the wait is in flight there, behind a row that shows.
    The read does not wait for W (that could go on for ever on a busy
    table): it stops before W's key, and the next read returns it."""
    ev = table_name
    conn.execute(f"CREATE TABLE {ev} (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)")
    conn.execute("SELECT pgkvx.enable(%s)", (ev,))
    conn.execute(f"INSERT INTO {ev} (id) SELECT generate_series(1, 5)")
    sql = f"SELECT id FROM {ev} WHERE id > 0 ORDER BY id LIMIT 100"
    for mode in ("optimistic", "fenced"):
        c = connect(db)
        c.execute(f"SET pgkvx.scan_mode = {mode}")
        (pid,) = c.execute("SELECT pg_backend_pid()").fetchone()
        res = {}
        with connect(db, autocommit=False) as x, connect(db, autocommit=False) as w:
            x.execute(f"UPDATE {ev} SET v = v + 1 WHERE id = 3")
            t = threading.Thread(target=lambda: res.update(rows=c.execute(sql).fetchall()))
            t.start()
            wait_until(lambda: conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                            (pid,)).fetchone() == (True,), "the read to wait for X")
            w.execute(f"INSERT INTO {ev} (id) VALUES (10)")          # W, in flight
            conn.execute(f"INSERT INTO {ev} (id) VALUES (11)")      # committed behind it
            x.commit()
            t.join(timeout=120)
            assert [r[0] for r in res["rows"]] == [1, 2, 3, 4, 5], (mode, res)
            w.commit()
        assert [r[0] for r in c.execute(sql).fetchall()] == [1, 2, 3, 4, 5, 10, 11]
        c.close()
        conn.execute(f"DELETE FROM {ev} WHERE id > 5")
    conn.execute(f"DROP TABLE {ev}")


def _later_writer_race(db, conn, t, sql, mode):
    """ids 1..10 and 20 committed.  E writes 11 (behind 20) and stays open;
    the read starts and waits for E; L (started after the read's snapshot)
    writes 12 and stays open; M writes 13 and commits; E commits; then L
    commits.  Returns the read's rows: a read that cannot stop before L's
    key waits for it."""
    c = connect(db)
    c.execute(f"SET pgkvx.scan_mode = {mode}")
    with connect(db, autocommit=False) as e, connect(db, autocommit=False) as late:
        e.execute(f"INSERT INTO {t} (id, v) VALUES (11, 1)")
        th, res = start_waiting(conn, c, "the read to wait for E", lambda: c.execute(sql).fetchall())
        late.execute(f"INSERT INTO {t} (id, v) VALUES (12, 0)")
        conn.execute(f"INSERT INTO {t} (id, v) VALUES (13, 3)")
        e.commit()
        th.join(timeout=1)
        late.commit()
        th.join(timeout=120)
    c.close()
    assert "out" in res, res
    conn.execute(f"DELETE FROM {t} WHERE id > 10 AND id <> 20")
    return res["out"]


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_reads_that_a_cut_would_falsify_read_whole_states(db, conn, table_name, mode):
    """A sort on another column, a watermark read beside the stream:
    stopping before L's key would hide 13, committed before 11 -- an answer
    no snapshot gives.  These reads see 11, 12 and 13 together.  (Newest
    first is no tail at all: it reads its snapshot and waits for nobody.)"""
    t = table_name
    conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)")
    conn.execute("SELECT pgkvx.enable(%s)", (t,))
    conn.execute(f"INSERT INTO {t} (id) SELECT generate_series(1, 10) UNION ALL SELECT 20")
    conn.execute(f"CREATE TABLE {t}_wm (k int PRIMARY KEY, hw int)")
    conn.execute(f"INSERT INTO {t}_wm VALUES (1, 13)")
    with connect(db, autocommit=False) as e, connect(db) as c:
        c.execute(f"SET pgkvx.scan_mode = {mode}")
        e.execute(f"INSERT INTO {t} (id, v) VALUES (11, 1)")
        newest = c.execute(f"SELECT id FROM {t} ORDER BY id DESC LIMIT 3").fetchall()
        assert [r[0] for r in newest] == [20, 10, 9], newest
        e.rollback()
    by_v = _later_writer_race(
        db, conn, t, f"SELECT id, v FROM (SELECT id, v FROM {t} WHERE id > 0 ORDER BY id) s ORDER BY v DESC LIMIT 1",
        mode)
    assert by_v == [(13, 3)], by_v
    with_wm = _later_writer_race(
        db, conn, t, f"SELECT id, (SELECT hw FROM {t}_wm WHERE k = 1) FROM {t} WHERE id > 10 ORDER BY id LIMIT 100",
        mode)
    assert [r[0] for r in with_wm] == [11, 12, 13, 20] and {r[1] for r in with_wm} == {13}, with_wm
    # A tail that reads nothing else stops before L's key instead.
    tail = _later_writer_race(db, conn, t, f"SELECT id FROM {t} WHERE id > 10 ORDER BY id LIMIT 100", mode)
    assert [r[0] for r in tail] == [11], tail
    conn.execute(f"DROP TABLE {t}, {t}_wm")


def _half_visible_race(db, conn, t, read, y_extra=(), iso=None):
    """ids 1..3 and 9 committed.  X writes 4 (behind 9) and stays open;
    `read(c)` starts and waits for X; W (later) writes 5 and stays open; Y writes 6 (and runs
    `y_extra`) and commits; X commits; a moment later W commits.  Y
    committed before X: no state shows 4 without 6, or without Y's other
    writes.  Returns what `read` returned."""
    c = connect(db, autocommit=iso is None)
    if iso:
        c.execute(f"SET TRANSACTION ISOLATION LEVEL {iso}")
    with connect(db, autocommit=False) as x, connect(db, autocommit=False) as w:
        x.execute(f"INSERT INTO {t} (id) VALUES (4)")
        th, res = start_waiting(conn, c, "the read to wait for X", lambda: read(c))
        w.execute(f"INSERT INTO {t} (id) VALUES (5)")
        with connect(db, autocommit=False) as y:
            y.execute(f"INSERT INTO {t} (id) VALUES (6)")
            for sql in y_extra:
                y.execute(sql)
            y.commit()
        x.commit()
        th.join(timeout=1)
        w.commit()
        th.join(timeout=120)
    c.close()
    assert "out" in res, res
    return res["out"]


def test_no_cut_where_something_else_the_statement_shows_could_be_ahead(db, conn, table_name):
    """Shapes where a cut would falsify what else the statement shows: a subplan whose rows
    become a value, a function reading another table, a row read FOR SHARE,
    a second latched table, a REPEATABLE READ transaction that reads on.
    Each read sees Y's writes whole (it waits for W instead of cutting)."""
    t, t2, wm = table_name, f"{table_name}_b", f"{table_name}_wm"
    conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    conn.execute(f"CREATE TABLE {t2} (id int PRIMARY KEY)")
    for r in (t, t2):
        conn.execute("SELECT pgkvx.enable(%s)", (r,))
        conn.execute(f"INSERT INTO {r} SELECT generate_series(1, 3)")
    conn.execute(f"INSERT INTO {t} VALUES (9)")
    conn.execute(f"CREATE TABLE {wm} (k int PRIMARY KEY, v int)")
    conn.execute(f"INSERT INTO {wm} VALUES (1, 0)")
    conn.execute(f"CREATE FUNCTION {wm}_hw() RETURNS int LANGUAGE plpgsql STABLE AS "
                 f"$$BEGIN RETURN (SELECT v FROM {wm} WHERE k = 1); END$$")

    def reset():
        conn.execute(f"DELETE FROM {t} WHERE id > 3 AND id <> 9")
        conn.execute(f"DELETE FROM {t2} WHERE id > 3")
        conn.execute(f"UPDATE {wm} SET v = 0")

    got = _half_visible_race(db, conn, t, lambda c: c.execute(
        f"SELECT ARRAY(SELECT id FROM {t} WHERE id > 0 ORDER BY id)").fetchone()[0])
    assert 4 in got and 6 in got, got
    reset()
    for read in (f"SELECT id, {wm}_hw() FROM {t} WHERE id > 0 ORDER BY id LIMIT 100",
                 f"SELECT id, (SELECT v FROM {wm} WHERE k = 1 FOR SHARE) FROM {t} WHERE id > 0 ORDER BY id LIMIT 100"):
        rows = _half_visible_race(db, conn, t, lambda c, read=read: c.execute(read).fetchall(),
                                  [f"UPDATE {wm} SET v = 6"])
        ids = [r[0] for r in rows]
        assert rows[0][1] != 6 or 6 in ids, (read, rows)
        reset()
    def union(c):
        # Index scans on both branches: each could cut on its own.
        c.execute("SET enable_seqscan = off")
        c.execute("SET enable_bitmapscan = off")
        return c.execute(f"(SELECT id, 'a' FROM {t} WHERE id > 0 ORDER BY id) UNION ALL "
                         f"(SELECT id, 'b' FROM {t2} WHERE id > 0 ORDER BY id)").fetchall()
    rows = _half_visible_race(db, conn, t, union, [f"INSERT INTO {t2} VALUES (4)"])
    assert ((4, "b") in rows) == ((6, "a") in rows), rows
    reset()

    def rr(c):
        ids = [r[0] for r in c.execute(f"SELECT id FROM {t} WHERE id > 0 ORDER BY id LIMIT 100").fetchall()]
        (n,) = c.execute(f"SELECT count(*) FROM {t}").fetchone()
        c.rollback()
        return ids, n
    ids, n = _half_visible_race(db, conn, t, rr, iso="REPEATABLE READ")
    assert len(ids) == n, (ids, n)
    conn.execute(f"DROP TABLE {t}, {t2}, {wm} CASCADE")
    conn.execute(f"DROP FUNCTION IF EXISTS {wm}_hw()")
