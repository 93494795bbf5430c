"""pgkvx.wait_for: a consumer at the head sleeps until a row past its cursor
commits, woken by the writer's commit through shared memory.

Every wait here that should end by a wake-up is given a timeout of ten
minutes and the test a much shorter hang guard: a lost wake-up shows as a
hang caught by the guard, never as a slow pass.  Waits that should time out
get short timeouts."""
import threading
import time

import psycopg
import pytest

from conftest import cluster, connect, scratch_database, wait_until

FOREVER = "10 min"   # wait_for's timeout where only a wake-up may end the wait
GUARD = 120          # seconds: hang guard for waits that a commit must end


def waiting_on(c, table):
    """pids waiting in wait_for on `table`, from the pgkvx.waiters view."""
    return {r[0] for r in c.execute("SELECT pid FROM pgkvx.waiters WHERE relid = %s::regclass", (table,)).fetchall()}


def table_stats(c, table):
    row = c.execute("""SELECT waiting, calls, immediate, woken, timeouts, broadcasts, spurious_wakeups
                         FROM pgkvx.wait_stats() WHERE relid = %s::regclass""", (table,)).fetchone()
    keys = ("waiting", "calls", "immediate", "woken", "timeouts", "broadcasts", "spurious")
    return dict(zip(keys, row)) if row else dict.fromkeys(keys, 0)


class Waiter(threading.Thread):
    """A session that calls wait_for once; `result` is its answer or error."""

    def __init__(self, db, sql, args=()):
        super().__init__(daemon=True)
        self.conn = connect(db)
        self.pid = self.conn.info.backend_pid
        self.sql, self.args = sql, args
        self.result = None

    def run(self):
        try:
            self.result = self.conn.execute(self.sql, self.args).fetchone()[0]
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.result = e

    def finish(self, guard=GUARD):
        self.join(guard)
        assert not self.is_alive(), "wait_for did not return: a lost wake-up"
        return self.result

    def close(self):
        if self.is_alive():
            with connect("postgres") as c:
                c.execute("SELECT pg_cancel_backend(%s)", (self.pid,))
            self.join(GUARD)
        self.conn.close()


def start_waiter(db, table, after, timeout=FOREVER, probe=None):
    w = Waiter(db, "SELECT pgkvx.wait_for(%s, %s, %s::interval)", (table, after, timeout))
    w.start()
    with connect(db) as c:
        wait_until(lambda: w.pid in waiting_on(c, table) or not w.is_alive(), f"session {w.pid} to wait")
    return w


@pytest.fixture
def ev(db, table_name):
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigserial PRIMARY KEY, payload text)")
        c.execute("SELECT pgkvx.enable(%s, gapless => true)", (table_name,))
    yield table_name
    with connect(db) as c:
        c.execute(f"DROP TABLE IF EXISTS {table_name}")


def test_commit_wakes_a_waiter_which_holds_no_snapshot(db, ev):
    with connect(db) as c:
        c.execute(f"INSERT INTO {ev} (payload) VALUES ('seen')")
        before = table_stats(c, ev)
        w = start_waiter(db, ev, "1")
        try:
            row = c.execute("""SELECT wait_event_type, wait_event, backend_xmin, state
                                 FROM pg_stat_activity WHERE pid = %s""", (w.pid,)).fetchone()
            assert row == ("Extension", "Extension", None, "active"), row
            assert w.is_alive()
            c.execute(f"INSERT INTO {ev} (payload) VALUES ('new')")
            assert w.finish() is True
        finally:
            w.close()
        after = table_stats(c, ev)
        assert after["woken"] == before["woken"] + 1
        assert after["broadcasts"] >= before["broadcasts"] + 1
        assert after["timeouts"] == before["timeouts"] and after["waiting"] == 0


def test_an_aborted_writer_does_not_end_the_wait(db, ev):
    with connect(db) as c:
        w = start_waiter(db, ev, None, timeout="2 s")
        try:
            with connect(db, autocommit=False) as wr:
                wr.execute(f"INSERT INTO {ev} (payload) VALUES ('aborted')")
                wr.rollback()
            assert w.finish() is False
        finally:
            w.close()
        s = table_stats(c, ev)
        assert s["timeouts"] == 1 and s["woken"] == 0 and s["broadcasts"] == 0


def test_rows_already_committed_return_at_once_and_the_timeout_false(db, ev):
    with connect(db) as c:
        c.execute(f"INSERT INTO {ev} (payload) VALUES ('a'), ('b')")
        assert c.execute("SELECT pgkvx.wait_for(%s, NULL, %s::interval)", (ev, FOREVER)).fetchone() == (True,)
        assert c.execute("SELECT pgkvx.wait_for(%s, '1', %s::interval)", (ev, FOREVER)).fetchone() == (True,)
        assert c.execute("SELECT pgkvx.wait_for(%s, '2', '50 ms')", (ev,)).fetchone() == (False,)
        assert c.execute("SELECT pgkvx.wait_for(%s, '2', '0')", (ev,)).fetchone() == (False,)
        s = table_stats(c, ev)
        assert (s["immediate"], s["timeouts"]) == (2, 2)


def test_cancel_and_statement_timeout_end_the_wait(db, ev):
    with connect(db) as c:
        w = start_waiter(db, ev, "0")
        c.execute("SELECT pg_cancel_backend(%s)", (w.pid,))
        assert isinstance(w.finish(), psycopg.errors.QueryCanceled)
        # The session goes on, and is no waiter any more.
        assert w.conn.execute("SELECT 1").fetchone() == (1,)
        assert waiting_on(c, ev) == set() and table_stats(c, ev)["waiting"] == 0
        w.close()
        with connect(db) as s:
            s.execute("SET statement_timeout = '200ms'")
            with pytest.raises(psycopg.errors.QueryCanceled):
                s.execute("SELECT pgkvx.wait_for(%s, '0', %s::interval)", (ev, FOREVER))
        assert table_stats(c, ev)["waiting"] == 0


def test_termination_ends_the_wait_and_its_registration(db, ev):
    with connect(db) as c:
        w = start_waiter(db, ev, "0")
        c.execute("SELECT pg_terminate_backend(%s)", (w.pid,))
        assert isinstance(w.finish(), psycopg.OperationalError)
        wait_until(lambda: c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                     (w.pid,)).fetchone() == (0,), "the terminated backend to exit")
        assert waiting_on(c, ev) == set()
        assert table_stats(c, ev)["waiting"] == 0
        w.conn.close()
        # A later commit finds nobody to wake.
        before = table_stats(c, ev)["broadcasts"]
        c.execute(f"INSERT INTO {ev} (payload) VALUES ('x')")
        assert table_stats(c, ev)["broadcasts"] == before


def test_one_commit_wakes_100_waiters_and_nobody_on_other_tables(db, ev):
    others = [f"{ev}_o{i}" for i in range(3)]
    with connect(db) as c:
        for o in others:
            c.execute(f"CREATE TABLE {o} (id bigserial PRIMARY KEY)")
            c.execute("SELECT pgkvx.enable(%s)", (o,))
        waiters, bystanders = [], []
        try:
            for _ in range(100):
                waiters.append(Waiter(db, "SELECT pgkvx.wait_for(%s, NULL, %s::interval)", (ev, FOREVER)))
            for o in others:
                for _ in range(5):
                    bystanders.append(Waiter(db, "SELECT pgkvx.wait_for(%s, NULL, %s::interval)", (o, FOREVER)))
            for w in waiters + bystanders:
                w.start()
            wait_until(lambda: len(waiting_on(c, ev)) == 100, "100 waiters")
            wait_until(lambda: all(len(waiting_on(c, o)) == 5 for o in others), "5 waiters on each other table")
            c.execute(f"INSERT INTO {ev} (payload) VALUES ('one')")
            assert [w.finish() for w in waiters] == [True] * 100
            s = table_stats(c, ev)
            assert (s["woken"], s["broadcasts"], s["waiting"]) == (100, 1, 0), s
            # The other tables' waiters were not woken, and still wait.
            for o in others:
                assert len(waiting_on(c, o)) == 5
                assert table_stats(c, o)["broadcasts"] == 0
            assert all(w.is_alive() for w in bystanders)
        finally:
            for w in waiters + bystanders:
                w.close()
            for o in others:
                c.execute(f"DROP TABLE {o}")


def test_a_commit_wakes_only_the_waiters_whose_cursor_it_passes(db, table_name):
    """Waiters at cursors 30, 40 and 50, and one before 10: a commit of key
    35 wakes the first alone; the others sleep on, never woken (the view
    counts their wake-ups), until a commit passes their own cursor."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
        c.execute(f"INSERT INTO {table_name} SELECT g * 10 FROM generate_series(1, 5) g")
        after = {cur: start_waiter(db, table_name, cur) for cur in ("50", "60", "70")}
        before = Waiter(db, "SELECT pgkvx.wait_for(%s, before => '10', timeout => %s::interval)",
                        (table_name, FOREVER))
        before.start()
        wait_until(lambda: before.pid in waiting_on(c, table_name), "the before-waiter")

        def wakeups():
            return dict(c.execute("SELECT pid, wakeups FROM pgkvx.waiters WHERE relid = %s::regclass",
                                  (table_name,)).fetchall())

        try:
            # Each commit that wakes someone is counted by the committer
            # before it returns: one per commit that passed a cursor.
            c.execute(f"INSERT INTO {table_name} VALUES (55)")
            assert after["50"].finish() is True
            assert table_stats(c, table_name)["broadcasts"] == 1
            c.execute(f"DELETE FROM {table_name} WHERE id = 20")          # behind every after-cursor
            assert table_stats(c, table_name)["broadcasts"] == 1
            still = wakeups()
            assert set(still) == {after["60"].pid, after["70"].pid, before.pid}, still
            c.execute(f"INSERT INTO {table_name} VALUES (5)")
            assert before.finish() is True
            c.execute(f"INSERT INTO {table_name} VALUES (65)")
            assert after["60"].finish() is True
            c.execute(f"INSERT INTO {table_name} VALUES (75)")
            assert after["70"].finish() is True
            # Every waiter woke once, to its row: none was woken for nothing.
            s = table_stats(c, table_name)
            assert (s["broadcasts"], s["woken"], s["spurious"]) == (4, 4, 0), s
        finally:
            for w in [*after.values(), before]:
                w.close()


@pytest.mark.parametrize("mode", ["optimistic", "fenced"])
def test_read_then_wait_never_misses_a_commit(db, ev, mode):
    """The consumer loop: read past the cursor; when nothing came back, wait.
    Producers commit at random moments, so commits land between the empty
    read and the wait as well as during it.  The consumer must get every
    committed row; a lost wake-up leaves it asleep (caught by the guard)."""
    import random
    import time
    n_per_producer, producers = 60, 3
    committed, lock, errors = set(), threading.Lock(), []

    def producer(seed):
        r = random.Random(seed)
        try:
            with connect(db, autocommit=False) as p:
                done = 0
                while done < n_per_producer:
                    (id_,) = p.execute(f"INSERT INTO {ev} (payload) VALUES ('x') RETURNING id").fetchone()
                    time.sleep(r.random() * 0.003)
                    if r.random() < 0.15:
                        p.rollback()
                        continue
                    p.commit()
                    with lock:
                        committed.add(id_)
                    done += 1
                    time.sleep(r.random() * 0.004)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    got, waits = [], {"true": 0, "false": 0}

    def consumer():
        try:
            with connect(db) as k:
                k.execute(f"SET pgkvx.scan_mode = {mode}")
                cursor = 0
                while len(got) < n_per_producer * producers:
                    rows = k.execute(f"SELECT id FROM {ev} WHERE id > %s ORDER BY id LIMIT 100",
                                     (cursor,)).fetchall()
                    for (id_,) in rows:
                        got.append(id_)
                        cursor = id_
                    if not rows:
                        (ok,) = k.execute("SELECT pgkvx.wait_for(%s, %s::text, %s::interval)",
                                          (ev, cursor, FOREVER)).fetchone()
                        waits["true" if ok else "false"] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ps = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(producers)]
    k = threading.Thread(target=consumer, daemon=True)
    k.start()
    for p in ps:
        p.start()
    for p in ps:
        p.join(GUARD)
    k.join(GUARD)
    assert not errors, errors
    assert not k.is_alive(), f"the consumer is stuck in wait_for with {len(got)} of {len(committed)} rows"
    assert sorted(got) == sorted(committed) and len(set(got)) == len(got)
    assert waits["false"] == 0 and waits["true"] > 0, waits


def test_commit_between_the_empty_read_and_the_wait(db, ev):
    """The race spelled out: the consumer's read finds nothing, a writer
    commits, then the consumer calls wait_for: it returns true at once."""
    with connect(db) as k, connect(db) as w:
        assert k.execute(f"SELECT id FROM {ev} WHERE id > 0 ORDER BY id LIMIT 100").fetchall() == []
        w.execute(f"INSERT INTO {ev} (payload) VALUES ('late')")
        assert k.execute("SELECT pgkvx.wait_for(%s, '0', %s::interval)", (ev, FOREVER)).fetchone() == (True,)


def test_composite_keys_wait_past_the_cursor_only(db, table_name):
    t = table_name
    with connect(db) as c:
        c.execute(f"CREATE TABLE {t} (cat int, id int, PRIMARY KEY (cat, id))")
        c.execute("SELECT pgkvx.enable(%s)", (t,))
        c.execute(f"INSERT INTO {t} SELECT c, g FROM generate_series(1, 2) c, generate_series(1, 100) g")
        q = "SELECT pgkvx.wait_for(%s, %s, '10 ms')"
        assert c.execute(q, (t, "(1,100)")).fetchone() == (True,)      # (2,1) lies past it
        assert c.execute(q, (t, "(2,99)")).fetchone() == (True,)
        assert c.execute(q, (t, "(2,100)")).fetchone() == (False,)
        assert c.execute(q, (t, "(1)")).fetchone() == (True,)          # a prefix: past every (1, …)
        assert c.execute(q, (t, "(2)")).fetchone() == (False,)
        # A writer in another category, behind the cursor, does not wake
        # the waiter (the committer counts every commit that woke someone
        # before it returns); one past it ends the wait.
        w = start_waiter(db, t, "(2,100)")
        try:
            c.execute(f"INSERT INTO {t} VALUES (1, 500)")
            assert table_stats(c, t)["broadcasts"] == 0
            c.execute(f"INSERT INTO {t} VALUES (2, 101)")
            assert w.finish() is True
        finally:
            w.close()
        s = table_stats(c, t)
        assert (s["broadcasts"], s["spurious"]) == (1, 0), s
        c.execute(f"DROP TABLE {t}")


def test_refusals(db, ev):
    with connect(db) as c:
        c.execute("SET pgkvx.scan_mode = off")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            c.execute("SELECT pgkvx.wait_for(%s, '0', '1 ms')", (ev,))
        assert "scan_mode" in e.value.diag.message_primary and e.value.diag.message_hint
        c.execute("RESET pgkvx.scan_mode")
        c.execute("DROP ROLE IF EXISTS wait_for_nobody")
        c.execute("CREATE ROLE wait_for_nobody")
        c.execute("GRANT USAGE ON SCHEMA pgkvx TO wait_for_nobody")
        try:
            c.execute("SET ROLE wait_for_nobody")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT pgkvx.wait_for(%s, '0', '1 ms')", (ev,))
            c.execute("RESET ROLE")
            c.execute(f"CREATE TABLE {ev}_plain (id int PRIMARY KEY)")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                c.execute("SELECT pgkvx.wait_for(%s, '0', '1 ms')", (f"{ev}_plain",))
            with pytest.raises(psycopg.errors.FeatureNotSupported):
                c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                c.execute("SELECT pgkvx.wait_for(%s, '0', '1 ms')", (ev,))
            c.execute("ROLLBACK")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                c.execute("BEGIN")
                c.execute(f"INSERT INTO {ev} (payload) VALUES ('mine')")
                c.execute("SELECT pgkvx.wait_for(%s, '0', '1 ms')", (ev,))
            c.execute("ROLLBACK")
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                c.execute("SELECT pgkvx.wait_for(%s, '0', '-1 s')", (ev,))
        finally:
            c.execute("RESET ROLE")
            c.execute(f"DROP TABLE IF EXISTS {ev}_plain")
            c.execute("REVOKE ALL ON SCHEMA pgkvx FROM wait_for_nobody")
            c.execute("DROP ROLE wait_for_nobody")


def test_search_path_cannot_change_the_answer(db, ev):
    with connect(db) as c:
        c.execute("CREATE SCHEMA IF NOT EXISTS evil")
        c.execute("""CREATE OR REPLACE FUNCTION evil.gt(bigint, bigint) RETURNS boolean
                     LANGUAGE sql AS 'SELECT true'""")
        c.execute("DROP OPERATOR IF EXISTS evil.> (bigint, bigint)")
        c.execute("CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.gt)")
        c.execute("SET search_path = evil, pg_catalog, public")
        c.execute(f"INSERT INTO public.{ev} (payload) VALUES ('a')")
        assert c.execute("SELECT pgkvx.wait_for(%s, '1', '10 ms')", (f"public.{ev}",)).fetchone() == (False,)
        c.execute("RESET search_path")
        c.execute("DROP SCHEMA evil CASCADE")


def test_inside_a_larger_query_the_snapshot_is_kept(db, ev):
    """Called inside a larger statement, the statement's snapshot may be
    read after the call, so the waiter keeps its xmin (and still wakes)."""
    with connect(db) as c:
        w = Waiter(db, "SELECT pgkvx.wait_for(%s, NULL, %s::interval), (SELECT count(*) FROM pg_class)",
                   (ev, FOREVER))
        w.start()
        try:
            wait_until(lambda: w.pid in waiting_on(c, ev), "the waiter")
            (xmin,) = c.execute("SELECT backend_xmin FROM pg_stat_activity WHERE pid = %s", (w.pid,)).fetchone()
            assert xmin is not None
            c.execute(f"INSERT INTO {ev} (payload) VALUES ('x')")
            assert w.finish() is True
        finally:
            w.close()


def test_other_snapshots_of_the_transaction_keep_their_xmin(db, ev):
    """In a transaction that reads a large object or exported a snapshot,
    a wait_for keeps the backend's xmin: a VACUUM during the sleep must
    not take the old versions those snapshots still read."""
    with connect(db) as c:
        (loid,) = c.execute("SELECT lo_from_bytea(0, 'old content')").fetchone()
        with connect(db, autocommit=False) as r:
            (fd,) = r.execute("SELECT lo_open(%s, 262144)", (loid,)).fetchone()   # INV_READ
            (name,) = r.execute("SELECT pg_export_snapshot()").fetchone()
            c.execute("SELECT lo_put(%s, 0, 'NEW CONTENT')", (loid,))
            c.execute(f"INSERT INTO {ev} (payload) VALUES ('x')")
            (pid,) = r.execute("SELECT pg_backend_pid()").fetchone()
            done = {}
            t = threading.Thread(target=lambda: done.update(
                r=r.execute("SELECT pgkvx.wait_for(%s, '1', '3 s')", (ev,)).fetchone()))
            t.start()
            wait_until(lambda: c.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                         (pid,)).fetchone() == ("Extension",), "the waiter to sleep")
            (xmin,) = c.execute("SELECT backend_xmin FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            c.execute("VACUUM pg_largeobject")
            t.join(timeout=30)
            assert done["r"] == (False,)
            assert xmin is not None, "the sleeping transaction dropped its xmin"
            assert r.execute("SELECT loread(%s, 100)", (fd,)).fetchone() == (b"old content",)
            with connect(db, autocommit=False) as other:
                other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                other.execute(f"SET TRANSACTION SNAPSHOT '{name}'")
                other.rollback()
            r.rollback()
        c.execute("SELECT lo_unlink(%s)", (loid,))


def test_wait_for_works_after_a_restart(db, ev):
    cluster("restart")
    with connect(db) as c:
        assert c.execute("SELECT value FROM pgkvx.stats() WHERE stat = 'wait_for_waiting'").fetchone() == (0,)
        w = start_waiter(db, ev, "0")
        try:
            c.execute(f"INSERT INTO {ev} (payload) VALUES ('after restart')")
            assert w.finish() is True
        finally:
            w.close()


def test_before_waits_for_a_key_before_the_cursor(db, table_name):
    """A tail read in reverse key order (`id < $cursor ORDER BY id DESC`)
    passes `before`: a commit of a key below the cursor ends the wait, one
    above it does not even wake it."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
        c.execute(f"INSERT INTO {table_name} VALUES (50), (60)")
        by_name = "SELECT pgkvx.wait_for(%s, before => %s, timeout => %s::interval)"
        # Rows already before the cursor: true at once; none: false at the timeout.
        assert c.execute(by_name, (table_name, "55", FOREVER)).fetchone() == (True,)
        assert c.execute(by_name, (table_name, "50", "0")).fetchone() == (False,)
        # A commit above the cursor does not wake the waiter (the committer
        # counts each commit that wakes someone before it returns); one
        # below ends the wait.
        w = Waiter(db, by_name, (table_name, "50", FOREVER))
        w.start()
        try:
            wait_until(lambda: w.pid in waiting_on(c, table_name) or not w.is_alive(), f"session {w.pid} to wait")
            before = table_stats(c, table_name)["broadcasts"]
            c.execute(f"INSERT INTO {table_name} VALUES (70)")
            assert table_stats(c, table_name)["broadcasts"] == before
            assert w.is_alive(), w.result
            c.execute(f"INSERT INTO {table_name} VALUES (49)")
            assert w.finish() is True
            assert table_stats(c, table_name)["broadcasts"] == before + 1
        finally:
            w.close()
        # Descending key index: "before" follows the key's order.
        c.execute(f"CREATE TABLE {table_name}_d (id int NOT NULL)")
        c.execute(f"CREATE UNIQUE INDEX {table_name}_d_key ON {table_name}_d (id DESC)")
        c.execute("SELECT pgkvx.enable(%s, %s)", (f"{table_name}_d", f"{table_name}_d_key"))
        c.execute(f"INSERT INTO {table_name}_d VALUES (50)")
        assert c.execute(by_name, (f"{table_name}_d", "49", "0")).fetchone() == (True,)
        assert c.execute(by_name, (f"{table_name}_d", "50", "0")).fetchone() == (False,)
        assert c.execute(by_name, (f"{table_name}_d", "51", "0")).fetchone() == (False,)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            c.execute("SELECT pgkvx.wait_for(%s, '1', '0', '2')", (table_name,))


def test_row_level_security_is_refused_clearly(db, table_name):
    """The look past the cursor reads the index without policies, so a role
    that row level security filters is refused (0A000, naming the table),
    or gets PostgreSQL's own 42501 with row_security off; the owner waits."""
    role = f"{table_name}_tenant"
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, tenant text NOT NULL DEFAULT 'a')")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
        c.execute(f"INSERT INTO {table_name} VALUES (1)")
        c.execute(f"ALTER TABLE {table_name} ENABLE ROW LEVEL SECURITY")
        c.execute(f"CREATE ROLE {role}")
        try:
            c.execute(f"GRANT SELECT ON {table_name} TO {role}")
            c.execute(f"GRANT USAGE ON SCHEMA pgkvx TO {role}")
            c.execute(f"CREATE POLICY own ON {table_name} TO {role} USING (tenant = 'a')")
            assert c.execute("SELECT pgkvx.wait_for(%s, NULL, '0')", (table_name,)).fetchone() == (True,)
            c.execute(f"SET ROLE {role}")
            with pytest.raises(psycopg.errors.FeatureNotSupported) as e:
                c.execute("SELECT pgkvx.wait_for(%s, NULL, '0')", (table_name,))
            assert table_name in e.value.diag.message_primary and "row level security" in e.value.diag.message_primary
            assert e.value.diag.message_hint
            c.execute("SET row_security = off")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT pgkvx.wait_for(%s, NULL, '0')", (table_name,))
        finally:
            c.execute("RESET ROLE")
            c.execute("RESET row_security")
            c.execute(f"DROP TABLE {table_name}")
            c.execute(f"REVOKE ALL ON SCHEMA pgkvx FROM {role}")
            c.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize("how", ["drop", "disable", "drop extension"])
def test_a_wait_ends_when_its_table_goes(db, table_name, how):
    """timeout => NULL: only the table's end can end this wait, and it must:
    the waiter wakes to an error naming what happened, and leaves the views."""
    with scratch_database(f"e2e_wait_gone_{how.replace(' ', '_')}") as name:
        with connect(name) as c:
            c.execute("CREATE EXTENSION pgkvx")
            c.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
            c.execute("SELECT pgkvx.enable(%s)", (table_name,))
            w = Waiter(name, "SELECT pgkvx.wait_for(%s, '10', NULL)", (table_name,))
            w.start()
            try:
                wait_until(lambda: w.pid in waiting_on(c, table_name), "the waiter")
                c.execute({"drop": f"DROP TABLE {table_name}",
                           "disable": f"SELECT pgkvx.disable('{table_name}')",
                           "drop extension": "DROP EXTENSION pgkvx CASCADE"}[how])
                err = w.finish()
                assert isinstance(err, psycopg.Error), err
                assert err.sqlstate in ("42P01", "55000"), (err.sqlstate, err)
            finally:
                w.close()


def test_a_wait_on_a_partitioned_table_outlives_partition_rotation(db, table_name):
    """Partitions dropped and detached while a waiter looks through them are
    no longer the table's: the wait goes on and ends at the commit it waits
    for, never with an error naming a partition that went."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY) PARTITION BY RANGE (id)")
        c.execute(f"CREATE TABLE {table_name}_0 PARTITION OF {table_name} FOR VALUES FROM (0) TO (1000)")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
    w = Waiter(db, "SELECT pgkvx.wait_for(%s, '1000000000', %s::interval)", (table_name, FOREVER))
    w.start()
    try:
        with connect(db) as c, connect(db) as ins:
            wait_until(lambda: w.pid in waiting_on(c, table_name), "the waiter")
            for k in range(1, 60):
                c.execute(f"CREATE TABLE {table_name}_{k} PARTITION OF {table_name} "
                          f"FOR VALUES FROM ({k * 1000}) TO ({(k + 1) * 1000})")
                # A commit before the cursor wakes the waiter to look again.
                ins.execute(f"INSERT INTO {table_name} VALUES ({k * 1000})")
                if k % 2:
                    c.execute(f"ALTER TABLE {table_name} DETACH PARTITION {table_name}_{k - 1}")
                    c.execute(f"DROP TABLE {table_name}_{k - 1}")
                else:
                    c.execute(f"DROP TABLE {table_name}_{k - 1}")
                assert w.is_alive(), w.result
            c.execute(f"CREATE TABLE {table_name}_big PARTITION OF {table_name} "
                      "FOR VALUES FROM (1000000000) TO (2000000000)")
            c.execute(f"INSERT INTO {table_name} VALUES (1000000001)")
            assert w.finish() is True
    finally:
        w.close()


def test_a_key_changed_under_a_waiter_is_parsed_anew(db, table_name):
    """disable and enable with a shorter key in one transaction: the waiter's
    cursor no longer fits the key, and it says so clearly (never XX000)."""
    with connect(db) as c:
        c.execute(f"CREATE TABLE {table_name} (a int NOT NULL, b int NOT NULL, "
                  f"CONSTRAINT {table_name}_pk PRIMARY KEY (a, b))")
        c.execute("SELECT pgkvx.enable(%s)", (table_name,))
        w = Waiter(db, "SELECT pgkvx.wait_for(%s, '(1,5)', %s::interval)", (table_name, FOREVER))
        w.start()
        try:
            wait_until(lambda: w.pid in waiting_on(c, table_name), "the waiter")
            with connect(db, autocommit=False) as d:
                d.execute("SELECT pgkvx.disable(%s)", (table_name,))
                d.execute(f"ALTER TABLE {table_name} DROP CONSTRAINT {table_name}_pk")
                d.execute(f"ALTER TABLE {table_name} ADD PRIMARY KEY (a)")
                d.execute("SELECT pgkvx.enable(%s)", (table_name,))
                d.commit()
            c.execute(f"INSERT INTO {table_name} VALUES (2, 1)")
            err = w.finish()
            assert isinstance(err, psycopg.Error), err
            assert not err.sqlstate.startswith("XX"), (err.sqlstate, err)
        finally:
            w.close()


def test_no_wait_while_holding_locks_a_writer_may_wait_for(db, ev):
    """LOCK TABLE, SELECT ... FOR UPDATE or a plain read of the table, then
    wait_for in the same transaction: the writer could be waiting for those
    locks (or behind DDL waiting for them) while the session waits for its
    commit, which no deadlock detector sees.  Refused; a transaction that
    read other tables may wait."""
    with connect(db) as c:
        c.execute(f"INSERT INTO {ev} (payload) VALUES ('a')")
    for first in (f"LOCK TABLE {ev} IN SHARE MODE", f"SELECT id FROM {ev} WHERE id = 1 FOR UPDATE"):
        with connect(db, autocommit=False) as r:
            r.execute(first)
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
                r.execute("SELECT pgkvx.wait_for(%s, '1', '1 s')", (ev,))
            assert "locks" in str(e.value), e.value
            r.rollback()
    # A read of the waited table in the same transaction holds a lock that
    # DDL queues behind, and producers behind the DDL: refused too.
    with connect(db, autocommit=False) as r:
        r.execute(f"SELECT count(*) FROM {ev}")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            r.execute("SELECT pgkvx.wait_for(%s, '0', '1 s')", (ev,))
        r.rollback()
    # Other reads only: it waits.
    with connect(db, autocommit=False) as r:
        r.execute("SELECT count(*) FROM pg_class")
        assert r.execute("SELECT pgkvx.wait_for(%s, '0', '1 s')", (ev,)).fetchone() == (True,)
        r.rollback()


def wait_once_on_new_tables(c, prefix, n, drop):
    """Creates and latches tables prefix_1..prefix_n and waits on each once
    (timeout 0); drops each after its wait when `drop`."""
    gone = "EXECUTE format('DROP TABLE %s_%s', $p$, i); COMMIT;" if drop else ""
    c.execute(f"""DO $$ DECLARE p text := '{prefix}'; BEGIN FOR i IN 1..{n} LOOP
                    EXECUTE format('CREATE TABLE %s_%s (id int PRIMARY KEY)', p, i);
                    PERFORM pgkvx.enable(format('%s_%s', p, i)::regclass);
                    COMMIT;
                    PERFORM pgkvx.wait_for(format('%s_%s', p, i)::regclass, NULL, '0');
                    {gone.replace("$p$", "p")}
                  END LOOP; END $$""")


def test_wait_slots_of_tables_that_went_are_reused(db):
    """Tables that come and go do not use the wait slots up: a new table
    waited on after a thousand others were created, waited on and dropped
    still has a slot of its own (wait_stats shows it by name)."""
    with connect(db) as c:
        wait_once_on_new_tables(c, "slot_churn", 1200, drop=True)
        wait_once_on_new_tables(c, "slot_churn_last", 1, drop=False)
        assert table_stats(c, "slot_churn_last_1")["calls"] == 1
        c.execute("DROP TABLE slot_churn_last_1")


def test_tables_waited_on_once_cannot_use_the_wait_slots_up(db):
    """A role that latches more tables than there are wait slots and waits
    on each once, keeping them: a table waited on later still gets a slot
    of its own (an idle one changes hands), and a commit there wakes only
    its waiters."""
    with connect(db) as c:
        wait_once_on_new_tables(c, "slot_keep", 1100, drop=False)
        c.execute("CREATE TABLE slot_keep_last (id int PRIMARY KEY)")
        c.execute("SELECT pgkvx.enable('slot_keep_last')")
        c.execute("SELECT pgkvx.wait_for('slot_keep_last', NULL, '0')")
        assert table_stats(c, "slot_keep_last")["calls"] == 1
        w = start_waiter(db, "slot_keep_last", None)
        try:
            before = table_stats(c, "slot_keep_last")
            # A commit elsewhere: a shared slot would wake the waiter to
            # nothing (a spurious wake-up); its own slot does not.
            c.execute("INSERT INTO slot_keep_1 VALUES (1)")
            time.sleep(0.2)
            assert w.is_alive()
            c.execute("INSERT INTO slot_keep_last VALUES (1)")
            assert w.finish() is True
            assert table_stats(c, "slot_keep_last")["spurious"] == before["spurious"]
        finally:
            w.close()
        c.execute("""DO $$ BEGIN FOR i IN 1..1100 LOOP
                       EXECUTE format('DROP TABLE slot_keep_%s', i); END LOOP; END $$""")
        c.execute("DROP TABLE slot_keep_last")
