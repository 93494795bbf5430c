"""arrow_query / arrow_scan read through cursors, by procedures that commit
inside the loop, and by WITH HOLD cursors.

arrow_query once read its query through a cursor (portal) of its own that
it looked up again by name on every call, and which user SQL could see in
pg_cursors: CLOSE plus a DECLARE of another shape under that name crashed
the server (SIGSEGV, crash-restart of every session), MOVE dropped record
batches from the stream, and at COMMIT PostgreSQL's walk over the portal
list either tripped over our cursor being dropped under it (a procedure
committing inside its loop: a crash, depending on the portal counter) or
dropped it before the holdable cursor that still needed it (WITH HOLD: the
COMMIT failed and rolled back).  Every test here must leave the server
running: a crash is detected from the server's own evidence (postmaster
and checkpointer pids, the server log) and the test waits for the
crash-restart to finish, so that the modules after it still find a server.
"""
import io
import os

import psycopg
import pyarrow.ipc as ipc
import pytest

from conftest import SCRATCH, conninfo, connect, wait_until

N = 12
INNER = f"select g, repeat(chr(97 + g % 26), g) AS s from generate_series(1, {N}) g"
EXPECTED = [(g, chr(97 + g % 26) * g) for g in range(1, N + 1)]
# The portal counters tried before the statement under test: PostgreSQL
# walks its portal hash table in an order that depends on the portal names,
# so an order-dependent failure shows for some of them only.
COUNTERS = range(0, 21)


def decode(chunks):
    """The rows of the Arrow stream the chunks concatenate to, as tuples."""
    table = ipc.open_stream(io.BytesIO(b"".join(bytes(c) for c in chunks))).read_all()
    return list(zip(*(table.column(i).to_pylist() for i in range(table.num_columns))))


class ServerWatch:
    """Notices a crash of any backend while a test runs: the postmaster pid
    (stays the same over a crash-restart, but not over a restart), the
    checkpointer pid (a crash-restart starts a new one) and the server log."""

    LOG = os.path.join(SCRATCH, "server.log")

    def __init__(self, db):
        self.db = db
        with connect(db) as c:
            # Commits are asynchronous on the scratch cluster: a crash would
            # lose the last ones (this module's database and tables among
            # them) unless they are on disk first.
            c.execute("CHECKPOINT")
        self.postmaster = self._postmaster()
        self.checkpointer = self._checkpointer()
        self.log_at = os.path.getsize(self.LOG)

    def _postmaster(self):
        with open(os.path.join(SCRATCH, "data", "postmaster.pid")) as f:
            return int(f.readline())

    def _checkpointer(self):
        with connect(self.db) as c:
            return c.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").fetchone()[0]

    def _new_log(self):
        with open(self.LOG, errors="replace") as f:
            f.seek(self.log_at)
            return f.read()

    def check(self, during=""):
        """Fails the test if the server crashed since the watch began, once
        it accepts connections again (`during` says what was running)."""
        def back():
            try:
                with connect(self.db) as c:
                    c.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                return False

        wait_until(back, "the server to accept connections again", timeout=180)
        # Read once the server is back: the postmaster logs a crash when it
        # reaps the backend, possibly after the client saw it go.
        crashed = [line for line in self._new_log().splitlines()
                   if "terminated by signal" in line or "terminating any other active server" in line]
        postmaster, checkpointer = self._postmaster(), self._checkpointer()
        before = (self.postmaster, self.checkpointer)
        # Report a crash once (the fixture checks again at teardown).
        self.postmaster, self.checkpointer = postmaster, checkpointer
        self.log_at = os.path.getsize(self.LOG)
        assert not crashed, f"a backend crashed{during}:\n" + "\n".join(crashed)
        assert postmaster == before[0], f"the postmaster restarted{during}"
        assert checkpointer == before[1], f"the server went through a crash-restart{during}"


def lost_connection(conn, e):
    return e.sqlstate is None or conn.broken


@pytest.fixture
def watch(db):
    w = ServerWatch(db)
    yield w
    w.check()


def other_cursors(conn):
    return [n for (n,) in conn.execute("SELECT name FROM pg_cursors WHERE name <> 'c' ORDER BY name")]


def fetch_stream_with_interference(db, watch, interfere):
    """Reads SELECT pgkvx.arrow_query(INNER, 1) through cursor c a batch at
    a time; between the first fetches `interfere(conn, name)` does what it
    likes to every other cursor pg_cursors shows (each attempt inside a
    savepoint, so that a refused one leaves c usable).  Returns the chunks."""
    conn = psycopg.connect(conninfo(db), autocommit=False)
    try:
        cur = conn.cursor(binary=True)
        cur.execute("DECLARE c CURSOR FOR SELECT pgkvx.arrow_query(%s, 1)", (INNER,))
        got = [r[0] for r in cur.execute("FETCH 1 FROM c").fetchall()]
        for _ in range(3):
            for name in other_cursors(conn):
                conn.execute("SAVEPOINT s")
                try:
                    interfere(conn, name)
                    conn.execute("RELEASE SAVEPOINT s")
                except psycopg.Error as e:
                    if lost_connection(conn, e):
                        raise
                    conn.execute("ROLLBACK TO SAVEPOINT s")
            got += [r[0] for r in cur.execute("FETCH 1 FROM c").fetchall()]
        got += [r[0] for r in cur.execute("FETCH ALL FROM c").fetchall()]
        conn.execute("CLOSE c")
        conn.commit()
        return got
    except psycopg.Error as e:
        if lost_connection(conn, e):
            watch.check()
        raise
    finally:
        conn.close()


def test_inner_cursor_closed_and_redeclared_with_another_shape(db, watch):
    """CLOSE the cursor arrow_query reads from and DECLARE one of another
    shape (int8 where the text column was) under its name, between fetches:
    the server must not crash, and the stream must stay complete and right
    (or the CLOSE must be refused)."""
    def close_and_redeclare(conn, name):
        conn.execute(f'CLOSE "{name}"')
        conn.execute(f'DECLARE "{name}" CURSOR FOR SELECT 1 AS g, 1::int8 AS s FROM generate_series(1, 100)')

    got = fetch_stream_with_interference(db, watch, close_and_redeclare)
    watch.check()
    assert decode(got) == EXPECTED


def test_inner_cursor_moved_between_fetches(db, watch):
    """MOVE (and FETCH) on the cursor arrow_query reads from, between
    fetches, must not take rows out of the stream."""
    def move(conn, name):
        conn.execute(f'MOVE 2 IN "{name}"')
        conn.execute(f'FETCH 1 FROM "{name}"')

    got = fetch_stream_with_interference(db, watch, move)
    watch.check()
    assert decode(got) == EXPECTED


# --- transaction control ----------------------------------------------------


@pytest.fixture(scope="module")
def procs(db):
    with connect(db) as c:
        c.execute("CREATE TABLE src (k int8 PRIMARY KEY, s text NOT NULL)")
        c.execute(f"INSERT INTO src SELECT g, repeat(chr(97 + g % 26), g::int) FROM generate_series(1, {N}) g")
        c.execute("CREATE TABLE chunks (run int, seq int, b bytea, PRIMARY KEY (run, seq))")
        c.execute("CREATE TABLE marks (run int PRIMARY KEY)")
        # Commits after every value of the stream: each COMMIT holds the
        # FOR loop's portal (HoldPinnedPortals), running the rest of the
        # stream to the end inside the commit.
        c.execute("""
            CREATE PROCEDURE commit_loop(run int, stmt text) LANGUAGE plpgsql AS $$
            DECLARE r record; i int := 0;
            BEGIN
              FOR r IN EXECUTE stmt LOOP
                i := i + 1;
                INSERT INTO chunks VALUES (run, i, r.b);
                COMMIT;
              END LOOP;
            END $$""")
        # k unnamed portals (PL/pgSQL FOR loops over queries), to move the
        # portal counter the next ones start from.
        c.execute("""
            CREATE PROCEDURE bump_portals(k int) LANGUAGE plpgsql AS $$
            DECLARE r record;
            BEGIN
              FOR i IN 1 .. k LOOP
                FOR r IN SELECT 1 LOOP END LOOP;
              END LOOP;
            END $$""")
    return db


STREAMS = {
    "query": f"SELECT pgkvx.arrow_query('{INNER}', 1) AS b",
    "scan": "SELECT pgkvx.arrow_scan('src', '{k,s}', batch_rows => 1) AS b",
}


@pytest.mark.parametrize("fn", ["query", "scan"])
def test_procedure_commits_inside_arrow_loop(procs, watch, fn):
    """CALL of a procedure that loops over the stream and COMMITs after each
    value: it runs to the end (or is refused with a clear error), never
    crashes, whatever the portal counter it starts from."""
    for k in COUNTERS:
        run = k + (0 if fn == "query" else 1000)
        with connect(procs) as c:
            c.execute("CALL bump_portals(%s)", (k,))
            try:
                c.execute("CALL commit_loop(%s, %s)", (run, STREAMS[fn]))
            except psycopg.Error as e:
                if lost_connection(c, e):
                    watch.check(f" in CALL commit_loop after {k} portals")
                    raise
                # Refused up front: it must say so clearly, and nothing of
                # the loop may have committed.
                assert e.sqlstate == "0A000", (k, e.sqlstate, str(e))
                got = c.execute("SELECT count(*) FROM chunks WHERE run = %s", (run,)).fetchone()[0]
                assert got == 0, (k, got)
                continue
            got = [b for (b,) in c.execute("SELECT b FROM chunks WHERE run = %s ORDER BY seq", (run,))]
        assert decode(got) == EXPECTED, k
    watch.check()


@pytest.mark.parametrize("fetch_first", [True, False])
@pytest.mark.parametrize("fn", ["query", "scan"])
def test_with_hold_cursor_over_arrow(procs, watch, fn, fetch_first):
    """A WITH HOLD cursor over the stream: the COMMIT that persists it
    commits (the transaction's own write stays), and the stream read after
    it is complete — or DECLARE is refused up front with a clear error."""
    for k in COUNTERS:
        run = k + (0 if fn == "query" else 1000) + (0 if fetch_first else 5000)
        conn = psycopg.connect(conninfo(procs), autocommit=False)
        try:
            conn.execute("CALL bump_portals(%s)", (k,))
            conn.commit()
            conn.execute("INSERT INTO marks VALUES (%s)", (run,))
            cur = conn.cursor(binary=True)
            try:
                cur.execute(f"DECLARE h CURSOR WITH HOLD FOR {STREAMS[fn]}")
            except psycopg.Error as e:
                if lost_connection(conn, e):
                    watch.check()
                    raise
                assert e.sqlstate == "0A000", (k, e.sqlstate, str(e))
                conn.rollback()
                continue
            got = [r[0] for r in cur.execute("FETCH 1 FROM h").fetchall()] if fetch_first else []
            try:
                conn.commit()
            except psycopg.Error as e:
                if lost_connection(conn, e):
                    watch.check()
                raise AssertionError(f"COMMIT of the WITH HOLD cursor failed (counter {k}): {e.sqlstate} {e}")
            got += [r[0] for r in cur.execute("FETCH ALL FROM h").fetchall()]
            conn.execute("CLOSE h")
            conn.commit()
        finally:
            conn.close()
        with connect(procs) as c:
            assert c.execute("SELECT count(*) FROM marks WHERE run = %s", (run,)).fetchone()[0] == 1, k
        assert decode(got) == EXPECTED, k
    watch.check()


@pytest.mark.parametrize("scroll", ["", "SCROLL"])
def test_cursor_over_arrow_query(db, watch, scroll):
    """A plain (or SCROLL) cursor over arrow_query, read a value at a time,
    a backward step on the scrollable one, and a cursor closed half-way."""
    conn = psycopg.connect(conninfo(db), autocommit=False)
    try:
        cur = conn.cursor(binary=True)
        cur.execute(f"DECLARE c {scroll} CURSOR FOR SELECT pgkvx.arrow_query(%s, 2)", (INNER,))
        got = []
        while True:
            rows = cur.execute("FETCH 1 FROM c").fetchall()
            if not rows:
                break
            got += [r[0] for r in rows]
        if scroll:
            back = cur.execute("FETCH BACKWARD 1 FROM c").fetchall()
            assert [bytes(r[0]) for r in back] == [bytes(got[-1])]
        conn.execute("CLOSE c")
        cur.execute("DECLARE d CURSOR FOR SELECT pgkvx.arrow_query(%s, 2)", (INNER,))
        cur.execute("FETCH 2 FROM d").fetchall()
        conn.execute("CLOSE d")
        conn.commit()
        assert decode(got) == EXPECTED
        assert conn.execute("SELECT count(*) FROM pg_cursors").fetchone()[0] == 0
    finally:
        conn.close()
