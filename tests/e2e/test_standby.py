"""Hot standbys: latches reach them through WAL (standby/), so a tail on a
standby waits for exactly the writers a tail on the primary would -- one
whose latch it replayed, one that ended, and one whose latch it never saw
because it started before the standby's replay did -- and every other read
there runs as plain PostgreSQL."""
import contextlib
import threading
import time

import psycopg
import pytest

from conftest import connect, events_table, replayed, restart_standby, writer_behind_a_commit

TAIL = "SELECT id FROM {t} WHERE id > %s ORDER BY id LIMIT 10"


def read_in_thread(standby, db, mode, sql, args, repeatable=False, cursor=False):
    """Runs `sql` on the standby in `mode` in a thread; returns (thread,
    result list).  With `repeatable`, inside a REPEATABLE READ transaction,
    and again after: the second read must show what the first did.  With
    `cursor`, through a cursor declared in a transaction and fetched ten
    rows at a time."""
    out = []

    def run():
        with connect(db, **standby) as s:
            s.execute(f"SET pgkvx.scan_mode = {mode}")
            s.execute("SET statement_timeout = '60s'")
            if cursor:
                with s.transaction(), s.cursor(name="sb_cursor") as c:
                    c.execute(sql, args)
                    rows = []
                    while batch := c.fetchmany(10):
                        rows += [r[0] for r in batch]
                out.append(rows)
                return
            if repeatable:
                s.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            out.append([r[0] for r in s.execute(sql, args).fetchall()])
            if repeatable:
                again = [r[0] for r in s.execute(sql, args).fetchall()]
                assert again == out[0], (again, out[0])
                out.append(again)
                s.execute("COMMIT")

    th = threading.Thread(target=run)
    th.start()
    return th, out


def late_writer_then_early_commit(db, standby, t, mode, end="commit", restart=False, repeatable=False,
                                  shape=None):
    """A writer draws key 6 and stays open; another draws 7 and commits.
    A tail from 5 on the standby in `mode` starts; the first writer then
    ends (`end`).  Returns what the tail returned.  With `restart`, the
    standby restarts past the first writer's latch before the tail reads.
    `shape` names another read of SHAPES than the plain LIMIT tail."""
    with connect(db) as p, connect(db, autocommit=False) as w6, connect(db, **standby) as s:
        events_table(p, t)
        w6.execute(f"INSERT INTO {t} (payload) VALUES ('late')")
        if restart:
            # Its latch record goes behind the standby's restartpoint: the
            # restarted standby never replays it.
            p.execute("CHECKPOINT")
            replayed(p, s)
            s.execute("CHECKPOINT")
            restart_standby()
        with connect(db) as w7:
            w7.execute(f"INSERT INTO {t} (payload) VALUES ('early')")
        with connect(db, **standby) as s2:
            replayed(p, s2)
            assert s2.execute(f"SELECT count(*) FROM {t} WHERE id = 7").fetchone() == (1,)
        sql, args = (TAIL, (5,)) if shape is None else SHAPES[shape][:2]
        th, out = read_in_thread(standby, db, mode, sql.format(t=t), args, repeatable, cursor=shape == "cursor")
        # Time for a tail that did not wait to return without 6.
        time.sleep(1.0)
        getattr(w6, end)()
        with connect(db, **standby) as s2:
            replayed(p, s2)
        th.join(60)
        assert not th.is_alive(), "the tail on the standby did not return"
        assert len(out) == (2 if repeatable else 1), out
        return out[0]


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_a_standby_tail_waits_for_a_writer_behind_its_rows(db, standby, mode):
    assert late_writer_then_early_commit(db, standby, "sb_late", mode) == [6, 7]


def test_a_repeatable_read_tail_on_a_standby_waits_and_its_transaction_reads_on_there(db, standby):
    assert late_writer_then_early_commit(db, standby, "sb_rr", "optimistic", repeatable=True) == [6, 7]


def test_a_standby_wait_honours_statement_timeout_and_leaves_the_session_usable(db, standby):
    with connect(db) as p, connect(db, **standby) as s, writer_behind_a_commit(p, db, "sb_timeout") as w6:
        replayed(p, s)
        s.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            s.execute(TAIL.format(t="sb_timeout"), (5,))
        s.execute("RESET statement_timeout")
        w6.rollback()
        replayed(p, s)
        assert s.execute(TAIL.format(t="sb_timeout"), (5,)).fetchall() == [(7,)]


# The read shapes a consumer moves its cursor with, on the standby: each
# with its statement and bound, and what it returns once the writer behind
# its rows has committed -- protected, and with pgkvx off (6 skipped).
SHAPES = {
    "cursor": ("SELECT id FROM {t} WHERE id > %s ORDER BY id", (5,), [6, 7], [7]),
    "subquery": ("SELECT id FROM (SELECT id, payload FROM {t} WHERE id > %s ORDER BY id LIMIT 10) s",
                 (5,), [6, 7], [7]),
    "join": ("SELECT e.id FROM {t} e JOIN pg_catalog.pg_namespace n ON n.nspname = 'pg_catalog' "
             "WHERE e.id > %s ORDER BY e.id LIMIT 10", (5,), [6, 7], [7]),
    "lateral": ("SELECT e.id FROM (VALUES (%s::bigint)) c(cur) "
                "CROSS JOIN LATERAL (SELECT id FROM {t} WHERE id > c.cur ORDER BY id LIMIT 10) e",
                (5,), [6, 7], [7]),
    "cte bound": ("WITH c AS (SELECT %s::bigint AS cur) SELECT id FROM {t}, c WHERE id > c.cur ORDER BY id LIMIT 10",
                  (5,), [6, 7], [7]),
    "descending": ("SELECT id FROM {t} WHERE id < %s ORDER BY id DESC LIMIT 10", (8,),
                   [7, 6, 5, 4, 3, 2, 1], [7, 5, 4, 3, 2, 1]),
}


@pytest.mark.parametrize("mode", ["optimistic", "fenced", "off"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_read_shape_of_a_tail_waits_on_a_standby(db, standby, shape, mode):
    t = f"sb_shape_{shape.replace(' ', '_')}_{mode}"
    protected, unprotected = SHAPES[shape][2:]
    got = late_writer_then_early_commit(db, standby, t, mode, shape=shape)
    assert got == (unprotected if mode == "off" else protected), (shape, mode, got)


def tail_while_writer_commits(db, standby, p, w6, mode, sql, args):
    """Once the standby has replayed what primary connection `p` wrote,
    runs tail `sql` there in `mode`, commits open writer `w6` a second
    later, and returns what the tail returned."""
    with connect(db, **standby) as s:
        replayed(p, s)
    th, out = read_in_thread(standby, db, mode, sql, args)
    time.sleep(1.0)  # time for a tail that did not wait to return without the writer's row
    w6.commit()
    with connect(db, **standby) as s:
        replayed(p, s)
    th.join(60)
    assert not th.is_alive(), "the tail on the standby did not return"
    assert len(out) == 1, out
    return out[0]


@pytest.mark.parametrize("mode", ["optimistic", "fenced", "off"])
def test_a_category_tail_on_a_standby_waits_for_a_writer_in_its_category(db, standby, mode):
    # Key (category, id): a writer of category 1 behind the cursor holds
    # the tail up; one of category 2 does not show in it at all.
    t = f"sb_category_{mode}"
    tail = f"SELECT id FROM {t} WHERE category = %s AND id > %s ORDER BY id LIMIT 10"
    with connect(db) as p, connect(db, autocommit=False) as w6:
        p.execute(f"DROP TABLE IF EXISTS {t}")
        p.execute(f"CREATE TABLE {t} (category int, id bigint, PRIMARY KEY (category, id))")
        p.execute(f"SELECT pgkvx.enable('{t}')")
        p.execute(f"INSERT INTO {t} SELECT c, i FROM generate_series(1, 2) c, generate_series(1, 5) i")
        w6.execute(f"INSERT INTO {t} VALUES (1, 6)")
        p.execute(f"INSERT INTO {t} VALUES (1, 7), (2, 6)")
        out = tail_while_writer_commits(db, standby, p, w6, mode, tail, (1, 5))
        assert out == ([7] if mode == "off" else [6, 7]), out


@pytest.mark.parametrize("mode", ["optimistic", "fenced", "off"])
def test_a_partitioned_tail_on_a_standby_waits_for_a_writer_in_another_partition(db, standby, mode):
    # Latched through its parent: the late key 6 goes to one partition, the
    # early 7 to another; the tail reads them all in key order.
    t = f"sb_parts_{mode}"
    with connect(db) as p, connect(db, autocommit=False) as w6:
        p.execute(f"DROP TABLE IF EXISTS {t}")
        p.execute(f"""CREATE TABLE {t} (id bigserial, part int NOT NULL, PRIMARY KEY (id, part))
                      PARTITION BY RANGE (part)""")
        for n in range(3):
            p.execute(f"CREATE TABLE {t}_{n} PARTITION OF {t} FOR VALUES FROM ({n}) TO ({n + 1})")
        p.execute(f"SELECT pgkvx.enable('{t}', gapless => true)")
        p.execute(f"INSERT INTO {t} (part) SELECT 1 FROM generate_series(1, 5)")
        w6.execute(f"INSERT INTO {t} (part) VALUES (0)")
        p.execute(f"INSERT INTO {t} (part) VALUES (2)")
        out = tail_while_writer_commits(db, standby, p, w6, mode, TAIL.format(t=t), (5,))
        assert out == ([7] if mode == "off" else [6, 7]), out


def test_a_standby_wait_ends_on_cancel_and_leaves_the_session_usable(db, standby):
    with connect(db) as p, connect(db, **standby) as s, writer_behind_a_commit(p, db, "sb_cancel") as w6:
        replayed(p, s)
        (pid,) = s.execute("SELECT pg_backend_pid()").fetchone()
        # Bounds a wait that ignored the cancel (its error would then say
        # statement timeout, not user request).
        s.execute("SET statement_timeout = '30s'")

        def cancel():
            with connect(db, **standby) as c:
                c.execute("SELECT pg_cancel_backend(%s)", (pid,))

        timer = threading.Timer(0.5, cancel)
        timer.start()
        t0 = time.monotonic()
        # A tail that did not wait for 6 would return [7] and raise nothing.
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            s.execute(TAIL.format(t="sb_cancel"), (5,))
        timer.join()
        assert time.monotonic() - t0 < 15, "the cancel did not end the wait at once"
        w6.rollback()
        replayed(p, s)
        assert s.execute(TAIL.format(t="sb_cancel"), (5,)).fetchall() == [(7,)]


def test_wait_for_before_a_cursor_on_a_standby_wakes_at_replay_of_a_key_below_it(db, standby):
    # A descending consumer waits for a key before its cursor: a commit
    # past the cursor does not wake it, the replayed commit below it does.
    with connect(db) as p, connect(db, **standby) as s:
        p.execute("DROP TABLE IF EXISTS sb_before")
        p.execute("CREATE TABLE sb_before (id bigint PRIMARY KEY)")
        p.execute("SELECT pgkvx.enable('sb_before')")
        p.execute("INSERT INTO sb_before SELECT generate_series(5, 9)")
        replayed(p, s)
        out = []

        def wait():
            with connect(db, **standby) as w:
                out.append(w.execute("SELECT pgkvx.wait_for('sb_before', before => '5', timeout => '30 seconds')")
                           .fetchone()[0])

        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.5)
        p.execute("INSERT INTO sb_before VALUES (10)")
        replayed(p, s)
        time.sleep(0.5)
        assert th.is_alive() and out == [], "woken by a key past its cursor"
        t0 = time.monotonic()
        p.execute("INSERT INTO sb_before VALUES (3)")
        th.join(30)
        assert not th.is_alive() and out == [True], out
        assert time.monotonic() - t0 < 10, "woken by its timeout, not the replayed commit"


def test_only_latched_writes_log_records_one_per_latch_and_one_per_transaction(db, standby):
    with connect(db) as p:
        if not p.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'").fetchone()[0]:
            pytest.skip("no pg_walinspect in this build")
        p.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        p.execute("DROP TABLE IF EXISTS sb_plain_rec, sb_many_rec")
        p.execute("CREATE TABLE sb_plain_rec (id bigint PRIMARY KEY)")
        p.execute("CREATE TABLE sb_many_rec (id bigint PRIMARY KEY, v int)")
        p.execute("SELECT pgkvx.enable('sb_many_rec')")
        (start,) = p.execute("SELECT pg_switch_wal()").fetchone()
        p.execute("INSERT INTO sb_plain_rec SELECT generate_series(1, 50)")
        with connect(db, autocommit=False) as w:
            # Three keys, the last of them written again: three latches.
            w.execute("INSERT INTO sb_many_rec VALUES (1, 0), (2, 0), (3, 0)")
            w.execute("UPDATE sb_many_rec SET v = 1 WHERE id = 3")
            w.commit()
        p.execute("SELECT pg_switch_wal()")
        (end,) = p.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
        kinds = [r[0] for r in p.execute(
            "SELECT record_type FROM pg_get_wal_records_info(%s, %s) WHERE resource_manager = 'pgkvx'",
            (start, end)).fetchall()]
        assert sorted(kinds) == ["LATCH", "LATCH", "LATCH", "RELEASE"], kinds
        assert kinds[-1] == "RELEASE", kinds


def test_without_protection_the_standby_tail_skips(db, standby):
    # The same race with pgkvx off on the standby: 7 shows without 6, a
    # cursor at 7 never sees 6.  (What makes the tests above able to fail.)
    assert late_writer_then_early_commit(db, standby, "sb_off", "off") == [7]


def test_a_standby_tail_goes_on_when_the_writer_behind_aborts(db, standby):
    assert late_writer_then_early_commit(db, standby, "sb_abort", "optimistic", end="rollback") == [7]


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_a_restarted_standby_waits_for_a_writer_whose_latch_it_never_replayed(db, standby, mode):
    assert late_writer_then_early_commit(db, standby, f"sb_restart_{mode}", mode, restart=True) == [6, 7]


def test_the_standby_shows_replayed_latches_and_their_holders(db, standby):
    with connect(db) as p, connect(db, autocommit=False) as w, connect(db, **standby) as s:
        events_table(p, "sb_view")
        w.execute("INSERT INTO sb_view (payload) VALUES ('open')")
        (xid,) = w.execute("SELECT txid_current()").fetchone()
        replayed(p, s)
        rows = s.execute("SELECT holder_xid, state FROM pgkvx.latches WHERE relid = 'sb_view'::regclass").fetchall()
        assert (xid, "live") in rows, rows
        # The in-order point and what holds a consumer up, from the same
        # replayed latches (the holder's pid is the primary's).
        assert s.execute("SELECT pgkvx.high_water('sb_view')").fetchone() == ("5",)
        (pid,) = w.execute("SELECT pg_backend_pid()").fetchone()
        assert s.execute("SELECT rank, holder_pid, holder_xid FROM pgkvx.head_blockers('sb_view', '5')").fetchall() \
            == [(1, pid, xid)]
        w.commit()
        replayed(p, s)
        assert s.execute("SELECT count(*) FROM pgkvx.latches WHERE relid = 'sb_view'::regclass").fetchone() == (0,)
        assert s.execute("SELECT pgkvx.high_water('sb_view')").fetchone() == ("6",)


def test_latch_records_are_readable_in_pg_walinspect(db, standby):
    with connect(db) as p:
        if not p.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'").fetchone()[0]:
            pytest.skip("no pg_walinspect in this build")
        p.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        events_table(p, "sb_wal")
        # pg_walinspect reads only flushed WAL; a segment switch flushes.
        (start,) = p.execute("SELECT pg_switch_wal()").fetchone()
        with connect(db, autocommit=False) as w:
            w.execute("INSERT INTO sb_wal (payload) VALUES ('one')")
            (xid,) = w.execute("SELECT txid_current()").fetchone()
            w.commit()
        p.execute("SELECT pg_switch_wal()")
        (end,) = p.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
        recs = p.execute("SELECT record_type, description FROM pg_get_wal_records_info(%s, %s) "
                         "WHERE resource_manager = 'pgkvx'", (start, end)).fetchall()
        kinds = [r[0] for r in recs]
        assert kinds == ["LATCH", "RELEASE"], recs
        assert recs[0][1].startswith(f"xid {xid} ") and "spans [" in recs[0][1], recs
        assert recs[1][1] == f"xid {xid} committed", recs


def test_reads_that_are_no_tails_run_plainly_on_a_standby(db, standby):
    with connect(db) as p, connect(db, **standby) as s:
        events_table(p, "sb_events")
        p.execute("DROP TABLE IF EXISTS sb_plain")
        p.execute("CREATE TABLE sb_plain (id int PRIMARY KEY)")
        p.execute("INSERT INTO sb_plain SELECT generate_series(1, 5)")
        replayed(p, s)
        assert s.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        # Reads that are no tails -- newest first, max(id), a count beside
        # a max -- run as plain PostgreSQL in every mode.
        for mode in ("optimistic", "fenced"):
            s.execute(f"SET pgkvx.scan_mode = {mode}")
            assert s.execute("SELECT id FROM sb_events ORDER BY id DESC LIMIT 2").fetchall() == [(5,), (4,)]
            assert s.execute("SELECT max(id), min(id) FROM sb_events").fetchone() == (5, 1)
            assert s.execute(
                "SELECT count(*) FROM sb_events WHERE id > (SELECT max(id) - 2 FROM sb_events)").fetchone() == (2,)
            # A tail with nobody in flight, and arrow_scan, just read.
            assert s.execute(TAIL.format(t="sb_events"), (2,)).fetchall() == [(3,), (4,), (5,)]
            assert s.execute("SELECT count(*) FROM pgkvx.arrow_scan('sb_events')").fetchone()[0] >= 1
        assert s.execute("SELECT id FROM sb_plain ORDER BY id LIMIT 2").fetchall() == [(1,), (2,)]


def test_wait_for_on_a_standby_wakes_when_the_commit_past_its_cursor_is_replayed(db, standby):
    from conftest import wait_until
    with connect(db) as p, connect(db, **standby) as s:
        events_table(p, "sb_wait")
        replayed(p, s)
        # Nothing past the cursor: it times out.
        assert s.execute("SELECT pgkvx.wait_for('sb_wait', '5', '200 milliseconds')").fetchone() == (False,)
        out = []

        def wait():
            with connect(db, **standby) as w:
                out.append(w.execute("SELECT pgkvx.wait_for('sb_wait', '5', '60 seconds')").fetchone()[0])

        th = threading.Thread(target=wait)
        th.start()
        wait_until(lambda: s.execute("SELECT count(*) FROM pgkvx.waiters WHERE relid = 'sb_wait'::regclass")
                   .fetchone()[0] == 1, "the waiter to sleep")
        # A commit behind the cursor wakes nobody; one past it does.
        p.execute("UPDATE sb_wait SET payload = 'y' WHERE id = 2")
        p.execute("INSERT INTO sb_wait (payload) VALUES ('new')")
        replayed(p, s)
        th.join(60)
        assert out == [True]
        (woken,) = s.execute("SELECT woken FROM pgkvx.wait_stats() WHERE relid = 'sb_wait'::regclass").fetchone()
        assert woken == 1, "woken by the replayed commit, not by its timeout"


@contextlib.contextmanager
def standby_setting(s, name, value):
    """`name` set to `value` on the standby `s` is connected to, for the
    block."""
    s.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    s.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        s.execute(f"ALTER SYSTEM RESET {name}")
        s.execute("SELECT pg_reload_conf()")


@pytest.mark.parametrize("delay", ["500ms", "-1"])
def test_a_waiting_standby_tail_replay_waits_for_gives_way_with_postgres_own_error(db, standby, delay):
    # An older transaction deletes rows and is running when the standby's
    # tail takes its snapshot; it ends, the primary vacuums its deletes away
    # (the writer the tail waits for is newer, so it does not hold them),
    # and the writer commits.  Replay of the cleanup waits for the tail, the
    # tail for replay of the commit behind it: the tail gives way with
    # PostgreSQL's own recovery-conflict error, and replay goes on.  With
    # max_standby_streaming_delay = -1 PostgreSQL never cancels the tail
    # itself: without pgkvx giving way it would end only at its
    # statement_timeout (57014).
    t = "sb_conflict" + ("_forever" if delay == "-1" else "")
    with connect(db) as p, connect(db, **standby) as s, standby_setting(s, "max_standby_streaming_delay", delay):
        p.execute(f"DROP TABLE IF EXISTS {t}_junk")
        p.execute(f"CREATE TABLE {t}_junk (x int) WITH (autovacuum_enabled = off)")
        p.execute(f"INSERT INTO {t}_junk SELECT generate_series(1, 1000)")
        with connect(db, autocommit=False) as old:
            old.execute(f"DELETE FROM {t}_junk")
            w6 = writer_behind_a_commit(p, db, t)
            try:
                replayed(p, s)
                err = []

                def read():
                    with connect(db, **standby) as r:
                        r.execute("SET pgkvx.scan_mode = fenced")
                        r.execute("SET statement_timeout = '30s'")
                        try:
                            r.execute(TAIL.format(t=t), (5,)).fetchall()
                        except psycopg.Error as e:
                            err.append(e)
                        # The session goes on.
                        assert r.execute("SELECT 1").fetchone() == (1,)

                th = threading.Thread(target=read)
                th.start()
                time.sleep(0.5)
                old.commit()
                p.execute(f"VACUUM {t}_junk")
                w6.commit()
                replayed(p, s)  # replay reaches the writer's end
                th.join(60)
                assert not th.is_alive(), "the conflicting tail did not give way"
                assert len(err) == 1 and err[0].sqlstate == "40001", err
                assert "conflict with recovery" in str(err[0]), err
            finally:
                w6.close()
        assert s.execute(TAIL.format(t=t), (5,)).fetchall() == [(6,), (7,)]


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_a_later_repeatable_read_tail_on_a_standby_fails_rather_than_skip_a_writer_that_committed(db, standby, mode):
    # The transaction's snapshot has the writer of 6 in flight; it commits
    # (and its latch is released on the standby) before the tail reads.
    # The tail cannot show 6 at that snapshot, so it must fail, as on the
    # primary -- not return 7 alone.  The standby's horizon must count the
    # primary's running transactions, or the released latch goes at once.
    with connect(db) as p, connect(db, **standby) as s, writer_behind_a_commit(p, db, f"sb_rr_{mode}") as w6:
        replayed(p, s)
        time.sleep(0.2)  # a horizon refreshed with nobody reading on the standby
        with connect(db, autocommit=False, **standby) as r:
            r.execute(f"SET pgkvx.scan_mode = {mode}")
            r.commit()
            r.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            r.execute("SELECT 1")
            w6.commit()
            replayed(p, s)
            with pytest.raises(psycopg.errors.SerializationFailure):
                r.execute(TAIL.format(t=f"sb_rr_{mode}"), (5,)).fetchall()
            r.rollback()
            # A fresh transaction reads both.
            assert r.execute(TAIL.format(t=f"sb_rr_{mode}"), (5,)).fetchall() == [(6,), (7,)]


def test_a_prepared_transaction_leaves_nothing_latched_on_the_standby(db, standby):
    # Its savepoint latched key 5 and rolled back (the primary released the
    # latch then); PREPARE needs no latches held, and the standby drops
    # what it still has of the transaction when it replays the PREPARE.
    with connect(db) as p, connect(db, **standby) as s:
        if p.execute("SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'sb_prep'").fetchone()[0]:
            p.execute("ROLLBACK PREPARED 'sb_prep'")  # left by an interrupted run
        events_table(p, "sb_prep")
        walinspect = p.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'").fetchone()[0]
        if walinspect:
            p.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        (start,) = p.execute("SELECT pg_switch_wal()").fetchone()
        with connect(db, autocommit=False) as w:
            w.execute("SAVEPOINT s")
            w.execute("UPDATE sb_prep SET payload = 'u' WHERE id = 5")
            (xid,) = w.execute("SELECT txid_current()").fetchone()
            w.execute("ROLLBACK TO SAVEPOINT s")
            w.execute("PREPARE TRANSACTION 'sb_prep'")
            # This session's next transaction logs no end for the prepared one.
            w.execute("SELECT 1")
            w.commit()
        try:
            replayed(p, s)
            assert s.execute("SELECT count(*) FROM pgkvx.latches WHERE holder_xid = %s", (xid,)).fetchone() == (0,)
            s.execute("SET statement_timeout = '10s'")
            assert s.execute(TAIL.format(t="sb_prep"), (3,)).fetchall() == [(4,), (5,)]
            if walinspect:
                p.execute("SELECT pg_switch_wal()")
                (end,) = p.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
                ends = [r[0] for r in p.execute(
                    "SELECT description FROM pg_get_wal_records_info(%s, %s) "
                    "WHERE resource_manager = 'pgkvx' AND record_type = 'RELEASE' AND description LIKE %s",
                    (start, end, f"xid {xid} %")).fetchall()]
                assert ends == [f"xid {xid} prepared"], ends
        finally:
            p.execute("ROLLBACK PREPARED 'sb_prep'")


def test_wait_for_on_a_standby_runs_inside_a_transaction_block(db, standby):
    with connect(db) as p, connect(db, **standby) as s:
        events_table(p, "sb_wait_tx")
        replayed(p, s)
        # Its lock check is a read: it assigns no xid (refused in recovery).
        s.execute("BEGIN")
        assert s.execute("SELECT pgkvx.wait_for('sb_wait_tx', '5', '50 milliseconds')").fetchone() == (False,)
        assert s.execute("SELECT pgkvx.wait_for('sb_wait_tx', '4', '50 milliseconds')").fetchone() == (True,)
        s.execute("COMMIT")


@pytest.mark.parametrize("mode", ["optimistic", "fenced", "off"])
def test_arrow_scan_on_a_standby_waits_for_a_writer_inside_what_it_reads(db, standby, mode):
    from test_arrow import chunks, read_pyarrow
    t = f"sb_arrow_{mode}"
    with connect(db) as p, connect(db, **standby) as s, writer_behind_a_commit(p, db, t) as w6:
        replayed(p, s)
        out = []

        def scan():
            with connect(db, **standby) as r:
                r.execute(f"SET pgkvx.scan_mode = {mode}")
                r.execute("SET statement_timeout = '60s'")
                buf = b"".join(chunks(r, "SELECT pgkvx.arrow_scan(%s::regclass)", (t,)))
                out.append(read_pyarrow(buf).column("id").to_pylist())

        th = threading.Thread(target=scan)
        th.start()
        time.sleep(1.0)  # time for a scan that did not wait to return without 6
        w6.commit()
        replayed(p, s)
        th.join(60)
        assert not th.is_alive()
        # Protected, the scan waited and has 6; off, it did not (what makes
        # this test able to fail).
        assert out == [[1, 2, 3, 4, 5, 7] if mode == "off" else [1, 2, 3, 4, 5, 6, 7]], out


def test_a_standby_tail_keeps_waiting_through_a_recovery_conflict_it_is_no_part_of(db, standby):
    # Replay waits for another standby session's lock on another table; the
    # tail holds nothing replay waits for, so it keeps waiting for its
    # writer (an error would do nothing for replay), and reads 6 and 7
    # once that session lets go and replay shows the writer's commit.
    with connect(db) as p, connect(db, **standby) as s, standby_setting(s, "max_standby_streaming_delay", "-1"):
        p.execute("DROP TABLE IF EXISTS sb_other")
        p.execute("CREATE TABLE sb_other (x int)")
        w6 = writer_behind_a_commit(p, db, "sb_bystander")
        try:
            replayed(p, s)
            with connect(db, autocommit=False, **standby) as other:
                other.execute("SELECT count(*) FROM sb_other")  # holds ACCESS SHARE on it
                th, out = read_in_thread(standby, db, "fenced", TAIL.format(t="sb_bystander"), (5,))
                time.sleep(0.3)
                with connect(db, autocommit=False) as locker:
                    locker.execute("LOCK TABLE sb_other IN ACCESS EXCLUSIVE MODE")
                    locker.execute("SELECT txid_current()")
                    locker.commit()
                w6.commit()
                # Replay now waits for `other`; the tail must not give way.
                time.sleep(0.5)
                assert th.is_alive() and out == [], out
                other.rollback()
            with connect(db, **standby) as s2:
                replayed(p, s2)
            th.join(60)
            assert not th.is_alive()
            assert out == [[6, 7]], out
        finally:
            w6.close()
