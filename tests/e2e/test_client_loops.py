"""Every client loop over a tail read gets exactly the rows a plain read
returns, and an error while a result is handed on leaves the session usable.

In `optimistic` mode a small LIMIT read in key order of a latched table
whose declared span meets a writer is run to its end into a buffer first
and then handed on from that buffer ("held rows"); so the loops run with a
writer in flight past their rows, in both modes (fenced reads then probe
their end and stream), and once more optimistic with no writer, where the
read checks its declared span first and streams.  Everything that fetches a
result in batches must not notice:
PL/pgSQL FOR loops (which fetch 10, then 50 rows per batch), explicit
cursors fetched after NOT FOUND, PL/Python and PL/Perl cursors, SQL-level
DECLARE/FETCH, psycopg's server-side cursors and prepared statements (custom
and generic plans).  A fetch from a portal that is already at its end runs
the executor with no movement; PostgreSQL still starts and shuts down the
receiver then, and SPI checks that it did.

Each loop is run for a table of LIMITs around those batch sizes, in both
protected modes, and compared row for row with the same read under
`pgkvx.scan_mode = off`.
"""
import contextlib
import re
import os
import socket
import struct

import psycopg
import pytest

from conftest import connect, connect_in_mode as session, wait_until

TABLE = "loops_t"
AFTER = 3
ROWS = 300
LIMITS = [0, 1, 2, 5, 9, 10, 11, 25, 49, 50, 51, 60, 61, 100, 1000]
MODES = ["optimistic", "fenced"]
# Optimistic with no writer in flight: the declared span is clean and the
# read streams, as a fenced one that met nobody (around the batch sizes).
STREAMED_LIMITS = [1, 10, 11, 50, 51]
TAIL = f"SELECT id FROM {TABLE} WHERE id > $1 ORDER BY id LIMIT $2"
TAIL_PY = f"SELECT id FROM {TABLE} WHERE id > %s ORDER BY id LIMIT %s"


def tail_sql(after, limit):
    return f"SELECT id FROM {TABLE} WHERE id > {int(after)} ORDER BY id LIMIT {int(limit)}"


SETUP = [
    f"CREATE TABLE {TABLE} (id int PRIMARY KEY, v text NOT NULL)",
    f"SELECT pgkvx.enable('{TABLE}')",
    f"INSERT INTO {TABLE} SELECT g, 'v' || g FROM generate_series(1, {ROWS}) g",
    # PL/pgSQL FOR over a query: a cursor fetched 10, then 50 rows at a time.
    f"""CREATE FUNCTION loop_for(after int, n bigint) RETURNS int[] LANGUAGE plpgsql AS $$
        DECLARE r record; acc int[] := '{{}}';
        BEGIN
            FOR r IN SELECT id FROM {TABLE} WHERE id > after ORDER BY id LIMIT n LOOP
                acc := acc || r.id;
            END LOOP;
            RETURN acc;
        END $$""",
    f"""CREATE FUNCTION loop_for_execute(after int, n bigint) RETURNS int[] LANGUAGE plpgsql AS $$
        DECLARE r record; acc int[] := '{{}}';
        BEGIN
            FOR r IN EXECUTE 'SELECT id FROM {TABLE} WHERE id > $1 ORDER BY id LIMIT $2' USING after, n LOOP
                acc := acc || r.id;
            END LOOP;
            RETURN acc;
        END $$""",
    f"""CREATE FUNCTION loop_for_bound(after int, n bigint) RETURNS int[] LANGUAGE plpgsql AS $$
        DECLARE
            c CURSOR (a int, m bigint) FOR SELECT id FROM {TABLE} WHERE id > a ORDER BY id LIMIT m;
            acc int[] := '{{}}';
        BEGIN
            FOR r IN c(after, n) LOOP
                acc := acc || r.id;
            END LOOP;
            RETURN acc;
        END $$""",
    # An explicit cursor fetched one row at a time, and again after NOT FOUND.
    f"""CREATE FUNCTION loop_fetch(after int, n bigint) RETURNS int[] LANGUAGE plpgsql AS $$
        DECLARE c refcursor; r record; acc int[] := '{{}}';
        BEGIN
            OPEN c NO SCROLL FOR SELECT id FROM {TABLE} WHERE id > after ORDER BY id LIMIT n;
            LOOP
                FETCH c INTO r;
                EXIT WHEN NOT FOUND;
                acc := acc || r.id;
            END LOOP;
            FOR i IN 1..3 LOOP
                FETCH c INTO r;
                IF FOUND THEN RAISE EXCEPTION 'FETCH after NOT FOUND found row %', r.id; END IF;
            END LOOP;
            MOVE c;
            IF FOUND THEN RAISE EXCEPTION 'MOVE after NOT FOUND found a row'; END IF;
            CLOSE c;
            RETURN acc;
        END $$""",
    f"""CREATE FUNCTION loop_fetch_execute(after int, n bigint) RETURNS int[] LANGUAGE plpgsql AS $$
        DECLARE c refcursor; r record; acc int[] := '{{}}';
        BEGIN
            OPEN c NO SCROLL FOR EXECUTE 'SELECT id FROM {TABLE} WHERE id > $1 ORDER BY id LIMIT $2' USING after, n;
            LOOP
                FETCH c INTO r;
                EXIT WHEN NOT FOUND;
                acc := acc || r.id;
            END LOOP;
            FETCH c INTO r;
            IF FOUND THEN RAISE EXCEPTION 'FETCH after NOT FOUND found row %', r.id; END IF;
            CLOSE c;
            RETURN acc;
        END $$""",
    f"""CREATE FUNCTION loop_return_query(after int, n bigint) RETURNS SETOF int LANGUAGE plpgsql AS $$
        BEGIN
            RETURN QUERY SELECT id FROM {TABLE} WHERE id > after ORDER BY id LIMIT n;
        END $$""",
    # PL/Python: a cursor iterated to its end, then fetched past it; and a
    # cursor fetched in batches of 7 until empty, then twice more.
    f"""CREATE FUNCTION py_iter(after int, n bigint) RETURNS int[] LANGUAGE plpython3u AS $$
plan = plpy.prepare("{TAIL}", ["int", "bigint"])
cur = plpy.cursor(plan, [after, n])
ids = [r["id"] for r in cur]
for _ in range(2):
    extra = cur.fetch(5)
    if len(extra):
        plpy.error("fetch past the end returned %d rows" % len(extra))
cur.close()
return ids
$$""",
    f"""CREATE FUNCTION py_fetch(after int, n bigint) RETURNS int[] LANGUAGE plpython3u AS $$
cur = plpy.cursor("SELECT id FROM {TABLE} WHERE id > %d ORDER BY id LIMIT %d" % (after, n))
ids = []
while True:
    rows = cur.fetch(7)
    if not len(rows):
        break
    ids.extend(r["id"] for r in rows)
for _ in range(2):
    extra = cur.fetch(7)
    if len(extra):
        plpy.error("fetch past the end returned %d rows" % len(extra))
cur.close()
return ids
$$""",
    # PL/Perl: spi_query/spi_fetchrow until undef, then spi_fetchrow again.
    f"""CREATE FUNCTION perl_fetchrow(integer, bigint) RETURNS int[] LANGUAGE plperl AS $$
my ($after, $n) = @_;
my $p = spi_prepare('{TAIL}', 'int', 'bigint');
my $c = spi_query_prepared($p, $after, $n);
my @ids;
while (defined(my $row = spi_fetchrow($c))) {{ push @ids, $row->{{id}}; }}
my $extra = spi_fetchrow($c);
elog(ERROR, 'spi_fetchrow past the end returned a row') if defined $extra;
my $c2 = spi_query("SELECT id FROM {TABLE} WHERE id > $after ORDER BY id LIMIT $n");
my @ids2;
while (defined(my $row = spi_fetchrow($c2))) {{ push @ids2, $row->{{id}}; }}
elog(ERROR, 'spi_query and spi_query_prepared disagree') unless "@ids" eq "@ids2";
spi_freeplan($p);
return \\@ids;
$$""",
]


@pytest.fixture(scope="module")
def loops(db):
    with connect(db) as c:
        available = {n for (n,) in c.execute(
            "SELECT name FROM pg_available_extensions WHERE name IN ('plpython3u', 'plperl')")}
        for lang in available:
            c.execute(f"CREATE EXTENSION IF NOT EXISTS {lang}")
        for stmt in SETUP:
            lang = re.search(r"LANGUAGE (plpython3u|plperl)\b", stmt)
            if lang is None or lang[1] in available:
                c.execute(stmt)
    return db


# Procedural languages some PostgreSQL builds lack (the downloaded 16 and 18
# here have neither): their loops are skipped there, and say so.  Debian's
# 15 has both (scripts/bootstrap installs them): missing there, they fail.
NEEDS_LANGUAGE = {"plpython_iterate_then_fetch": "plpython3u", "plpython_fetch_batches": "plpython3u",
                  "plperl_fetchrow": "plperl"}


def skip_without_language(db, kind):
    lang = NEEDS_LANGUAGE.get(kind)
    if lang:
        with connect(db) as c:
            if (c.info.server_version >= 160000
                    and c.execute("SELECT count(*) FROM pg_language WHERE lanname = %s", (lang,)).fetchone() == (0,)):
                pytest.skip(f"{lang} is not in this PostgreSQL build")


@pytest.fixture(scope="module")
def plain_reads(loops):
    """What a plain read returns, per LIMIT."""
    with connect(loops) as c:
        c.execute("SET pgkvx.scan_mode = off")
        return {n: [i for (i,) in c.execute(tail_sql(AFTER, n))] for n in LIMITS}


# ---- the loops: each returns the list of runs (each run: ids delivered) ----

def sql_function(name):
    def run(db, mode, n):
        with session(db, mode) as c:
            return [list(c.execute(f"SELECT {name}(%s, %s)", (AFTER, n)).fetchone()[0])]
    return run


def return_query(db, mode, n):
    with session(db, mode) as c:
        return [[i for (i,) in c.execute("SELECT * FROM loop_return_query(%s, %s)", (AFTER, n))]]


def declare_fetch(batch, simple, scroll="NO SCROLL"):
    """SQL-level DECLARE, FETCH <batch> until empty, then FETCH twice more
    past the end (each must still describe its empty result)."""
    def run(db, mode, n):
        with session(db, mode) as c:
            cur = psycopg.ClientCursor(c) if simple else c.cursor()
            ids = []
            with c.transaction():
                cur.execute(f"DECLARE tail_c {scroll} CURSOR FOR {tail_sql(AFTER, n)}")
                while True:
                    rows = cur.execute(f"FETCH {batch} FROM tail_c").fetchall()
                    if not rows:
                        break
                    ids += [i for (i,) in rows]
                for _ in range(2):
                    assert cur.execute(f"FETCH {batch} FROM tail_c").fetchall() == []
                    assert cur.statusmessage == "FETCH 0"
                cur.execute("MOVE FORWARD 1 IN tail_c")
                assert cur.statusmessage == "MOVE 0"
                cur.execute("CLOSE tail_c")
            return [ids]
    return run


def holdable(db, mode, n):
    """A WITH HOLD cursor: half fetched in the transaction, the rest after
    COMMIT, then past the end."""
    with session(db, mode) as c:
        cur = psycopg.ClientCursor(c)
        ids = []
        with c.transaction():
            cur.execute(f"DECLARE hold_c NO SCROLL CURSOR WITH HOLD FOR {tail_sql(AFTER, n)}")
            ids += [i for (i,) in cur.execute(f"FETCH {max(1, n // 2)} FROM hold_c").fetchall()]
        while rows := cur.execute("FETCH 10 FROM hold_c").fetchall():
            ids += [i for (i,) in rows]
        assert cur.execute("FETCH 10 FROM hold_c").fetchall() == []
        cur.execute("CLOSE hold_c")
        return [ids]


def holdable_at_end(db, mode, n):
    """A WITH HOLD cursor fetched to its end before COMMIT: the commit runs
    the executor once more, with no movement, to persist what is left."""
    with session(db, mode) as c:
        cur = psycopg.ClientCursor(c)
        ids = []
        with c.transaction():
            cur.execute(f"DECLARE hold_c NO SCROLL CURSOR WITH HOLD FOR {tail_sql(AFTER, n)}")
            while rows := cur.execute("FETCH 10 FROM hold_c").fetchall():
                ids += [i for (i,) in rows]
        assert cur.execute("FETCH 10 FROM hold_c").fetchall() == []
        cur.execute("CLOSE hold_c")
        return [ids]


def named_fetchmany(db, mode, n):
    """psycopg server-side cursor (NO SCROLL), fetchmany(10) until empty,
    then past the end."""
    with session(db, mode, autocommit=False) as c:
        with c.cursor(name="tail_nc", scrollable=False) as cur:
            cur.execute(TAIL_PY, (AFTER, n))
            ids = []
            while rows := cur.fetchmany(10):
                ids += [i for (i,) in rows]
            assert cur.fetchmany(10) == []
            assert cur.fetchone() is None
            assert cur.fetchall() == []
        c.commit()
        return [ids]


def named_iter(db, mode, n):
    """psycopg server-side cursor (scrollability left to the server),
    iterated 7 rows per FETCH, then fetched past the end."""
    with session(db, mode, autocommit=False) as c:
        with c.cursor(name="tail_ni") as cur:
            cur.itersize = 7
            cur.execute(TAIL_PY, (AFTER, n))
            ids = [i for (i,) in cur]
            assert cur.fetchmany(7) == []
        c.commit()
        return [ids]


def prepared(generic):
    """The extended protocol: one prepared statement executed repeatedly
    (psycopg prepare=True), with the plan cache left alone or forced to a
    generic plan."""
    def run(db, mode, n):
        with session(db, mode) as c:
            if generic:
                c.execute("SET plan_cache_mode = force_generic_plan")
            runs = []
            for _ in range(8):
                runs.append([i for (i,) in c.execute(TAIL_PY, (AFTER, n), prepare=True)])
            return runs
    return run


def sql_prepare_execute(db, mode, n):
    """SQL-level PREPARE/EXECUTE over the simple protocol: five custom
    plans, then the generic one."""
    with session(db, mode) as c:
        cur = psycopg.ClientCursor(c)
        cur.execute(f"PREPARE tail_p(int, bigint) AS {TAIL}")
        runs = [[i for (i,) in cur.execute(f"EXECUTE tail_p({AFTER}, {int(n)})")] for _ in range(8)]
        cur.execute("DEALLOCATE tail_p")
        return runs


class Wire:
    """Just enough of the frontend/backend protocol to do what libpq
    cannot: Execute a portal for at most N rows at a time (as JDBC's
    fetchSize and Npgsql do), then Execute it again past its end."""

    def __init__(self, db):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(60)  # a hang guard
        self.s.connect(f"{os.environ.get('PGHOST', '/tmp')}/.s.PGSQL.{os.environ.get('PGPORT', '55432')}")
        body = struct.pack("!I", 196608) + b"user\0postgres\0database\0" + db.encode() + b"\0\0"
        self.s.sendall(struct.pack("!I", len(body) + 4) + body)
        self.until(b"Z")

    def send(self, typ, payload=b""):
        self.s.sendall(typ + struct.pack("!I", len(payload) + 4) + payload)

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            assert chunk, "the server closed the connection"
            buf += chunk
        return buf

    def recv(self):
        typ, n = struct.unpack("!cI", self.recv_exact(5))
        return typ, self.recv_exact(n - 4)

    def until(self, *stops):
        """Messages up to one of `stops`; an ErrorResponse fails the test."""
        got = []
        while True:
            typ, body = self.recv()
            if typ == b"E":
                fields = dict((f[:1], f[1:].decode()) for f in body.split(b"\0") if f)
                raise AssertionError(f"ErrorResponse {fields.get(b'C')}: {fields.get(b'M')}")
            got.append((typ, body))
            if typ in stops:
                return got

    def query(self, sql):
        self.send(b"Q", sql.encode() + b"\0")
        self.until(b"Z")

    def close(self):
        self.send(b"X")
        self.s.close()


def wire_execute(max_rows):
    def run(db, mode, n):
        w = Wire(db)
        try:
            w.query(f"SET pgkvx.scan_mode = {mode}")
            w.query("BEGIN")
            params = [str(AFTER).encode(), str(int(n)).encode()]
            bind = b"tail_portal\0\0" + struct.pack("!hh", 0, len(params))
            for p in params:
                bind += struct.pack("!I", len(p)) + p
            bind += struct.pack("!h", 0)
            w.send(b"P", b"\0" + TAIL.encode() + b"\0" + struct.pack("!h", 0))
            w.send(b"B", bind)
            w.send(b"H")
            w.until(b"2")
            ids, tags = [], []
            while True:
                w.send(b"E", b"tail_portal\0" + struct.pack("!I", max_rows))
                w.send(b"H")
                msgs = w.until(b"s", b"C")
                for typ, body in msgs:
                    if typ == b"D":
                        (ncols,) = struct.unpack("!h", body[:2])
                        (ln,) = struct.unpack("!i", body[2:6])
                        ids.append(int(body[6:6 + ln]))
                if msgs[-1][0] == b"C":
                    tags.append(msgs[-1][1].rstrip(b"\0").decode())
                    break
            # Once more, past the end: no rows, no error.
            w.send(b"E", b"tail_portal\0" + struct.pack("!I", max_rows))
            w.send(b"S")
            msgs = w.until(b"Z")
            assert not [m for m in msgs if m[0] == b"D"], "Execute past the end returned rows"
            w.query("COMMIT")
            return [ids]
        finally:
            w.close()
    return run


LOOPS = {
    "plpgsql_for": sql_function("loop_for"),
    "plpgsql_for_execute": sql_function("loop_for_execute"),
    "plpgsql_for_bound_cursor": sql_function("loop_for_bound"),
    "plpgsql_fetch_after_not_found": sql_function("loop_fetch"),
    "plpgsql_fetch_execute_after_not_found": sql_function("loop_fetch_execute"),
    "plpgsql_return_query": return_query,
    "plpython_iterate_then_fetch": sql_function("py_iter"),
    "plpython_fetch_batches": sql_function("py_fetch"),
    "plperl_fetchrow": sql_function("perl_fetchrow"),
    "sql_fetch_10_simple": declare_fetch(10, simple=True),
    "sql_fetch_1_simple": declare_fetch(1, simple=True),
    "sql_fetch_10_extended": declare_fetch(10, simple=False),
    "sql_fetch_all_simple": declare_fetch("ALL", simple=True),
    "sql_fetch_10_default_scroll": declare_fetch(10, simple=True, scroll=""),
    "sql_holdable": holdable,
    "sql_holdable_fetched_to_end": holdable_at_end,
    "psycopg_named_fetchmany": named_fetchmany,
    "psycopg_named_iter": named_iter,
    "psycopg_prepared": prepared(generic=False),
    "psycopg_prepared_generic_plan": prepared(generic=True),
    "sql_prepare_execute": sql_prepare_execute,
    "protocol_execute_max_rows_1": wire_execute(1),
    "protocol_execute_max_rows_10": wire_execute(10),
    "protocol_execute_max_rows_50": wire_execute(50),
}


@contextlib.contextmanager
def writer_in(db, table, row):
    """A transaction in flight that inserted `row` into `table`."""
    w = connect(db, autocommit=False)
    try:
        w.execute(f"INSERT INTO {table} VALUES {row}")
        yield
    finally:
        w.rollback()
        w.close()


def writer_past_rows(db):
    """A transaction in flight with a row past every read's rows: inside the
    declared span `id > AFTER`, outside what any LIMIT here returns."""
    return writer_in(db, TABLE, f"({ROWS + 1000}, 'late')")


def check_loop(db, plain_reads, kind, mode, limit, label):
    expected = plain_reads[limit]
    assert len(expected) == min(limit, ROWS - AFTER)
    runs = LOOPS[kind](db, mode, limit)
    assert runs, "the loop ran nothing"
    for i, got in enumerate(runs):
        assert got == expected, (f"{kind} ({label}, LIMIT {limit}), run {i + 1}: delivered {len(got)} rows, "
                                 f"a plain read returns {len(expected)}")


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(LOOPS))
def test_loop_delivers_what_a_plain_read_returns(loops, plain_reads, kind, mode, limit):
    skip_without_language(loops, kind)
    with writer_past_rows(loops):
        check_loop(loops, plain_reads, kind, mode, limit, f"{mode}, a writer past the rows")


@pytest.mark.parametrize("limit", STREAMED_LIMITS)
@pytest.mark.parametrize("kind", list(LOOPS))
def test_streamed_loop_delivers_what_a_plain_read_returns(loops, plain_reads, kind, limit):
    skip_without_language(loops, kind)
    check_loop(loops, plain_reads, kind, "optimistic", limit, "optimistic, streamed")


def test_small_tail_reads_are_held_beside_a_writer_and_streamed_without(loops):
    """The loops above exercise both: beside a writer in its declared span a
    small optimistic tail read is run into a buffer first; with none there
    it streams."""
    explain = f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {tail_sql(AFTER, 5)}"
    with writer_past_rows(loops), session(loops, "optimistic") as c:
        plan = [r.strip() for (r,) in c.execute(explain)]
        assert "Mode: optimistic" in plan, plan
    with session(loops, "optimistic") as c:
        plan = [r.strip() for (r,) in c.execute(explain)]
        assert "Mode: optimistic, declared spans clean: streamed" in plan, plan


# ---- an error while rows are handed on -----------------------------------

ERR_SETUP = [
    # A row whose text LATIN1 cannot represent.
    "CREATE TABLE enc_t (id int PRIMARY KEY, v text NOT NULL)",
    "SELECT pgkvx.enable('enc_t')",
    "INSERT INTO enc_t VALUES (1, 'a'), (2, 'b'), (3, 'price: 5 €'), (4, 'd'), (5, 'e'), (6, 'f')",
    # A type without a binary output (send) function.
    "CREATE TABLE acl_t (id int PRIMARY KEY, a aclitem NOT NULL)",
    "SELECT pgkvx.enable('acl_t')",
    "INSERT INTO acl_t SELECT g, 'postgres=r/postgres' FROM generate_series(1, 6) g",
    # A value whose output function raises: an enum label removed behind
    # the catalog's back (enum_out: "invalid internal value for enum").
    "CREATE TYPE mood AS ENUM ('fine', 'gone')",
    "CREATE TABLE enum_t (id int PRIMARY KEY, m mood NOT NULL)",
    "SELECT pgkvx.enable('enum_t')",
    "INSERT INTO enum_t VALUES (1, 'fine'), (2, 'fine'), (3, 'gone'), (4, 'fine'), (5, 'fine')",
    "DELETE FROM pg_enum WHERE enumtypid = 'mood'::regtype AND enumlabel = 'gone'",
    # A function in the select list that raises on the third row: the error
    # happens while the statement runs into its buffer.
    """CREATE FUNCTION boom_on_3(id int) RETURNS int LANGUAGE plpgsql STABLE AS $$
        BEGIN
            IF id = 3 THEN RAISE EXCEPTION 'boom on row %', id USING ERRCODE = 'P0042'; END IF;
            RETURN id;
        END $$""",
]


@pytest.fixture(scope="module")
def err_tables(loops):
    with connect(loops) as c:
        for stmt in ERR_SETUP:
            c.execute(stmt)
    return loops


def encoding_simple(c):
    c.execute("SET client_encoding = 'LATIN1'")
    try:
        psycopg.ClientCursor(c).execute("SELECT id, v FROM enc_t WHERE id > 0 ORDER BY id LIMIT 5").fetchall()
    finally:
        c.execute("RESET client_encoding")


def encoding_extended(c):
    c.execute("SET client_encoding = 'LATIN1'")
    try:
        c.execute("SELECT id, v FROM enc_t WHERE id > %s ORDER BY id LIMIT %s", (0, 5), prepare=True).fetchall()
    finally:
        c.execute("RESET client_encoding")


def encoding_copy_out(c):
    c.execute("SET client_encoding = 'LATIN1'")
    try:
        with c.cursor().copy("COPY (SELECT id, v FROM enc_t WHERE id > 0 ORDER BY id LIMIT 5) TO STDOUT") as cp:
            for _ in cp:
                pass
    finally:
        c.execute("RESET client_encoding")


def binary_without_send(c):
    c.cursor(binary=True).execute("SELECT id, a FROM acl_t WHERE id > 0 ORDER BY id LIMIT 5").fetchall()


def output_function_raises(c):
    psycopg.ClientCursor(c).execute("SELECT id, m FROM enum_t WHERE id > 0 ORDER BY id LIMIT 5").fetchall()


def raise_in_buffered_run(c):
    c.execute(f"SELECT boom_on_3(id) FROM {TABLE} WHERE id > 0 ORDER BY id LIMIT 5").fetchall()


ERRORS = {
    # (provoke, what the client's error says).  Whether the error keeps its
    # SQLSTATE and fields is test_plain_parity's business: here it is what
    # the session is left in.
    "encoding_simple_protocol": (encoding_simple, "has no equivalent in encoding"),
    "encoding_extended_protocol": (encoding_extended, "has no equivalent in encoding"),
    "encoding_copy_out": (encoding_copy_out, "has no equivalent in encoding"),
    "binary_format_without_send_function": (binary_without_send, "no binary output function available for type aclitem"),
    "output_function_raises": (output_function_raises, "invalid internal value for enum"),
    "raise_in_buffered_run": (raise_in_buffered_run, "boom on row 3"),
}
# The table each case reads, and a row past its reads' rows for a writer to
# hold in flight: then an optimistic read holds its rows back first.
READS = {"encoding_simple_protocol": ("enc_t", "(90000, 'late')"),
         "encoding_extended_protocol": ("enc_t", "(90000, 'late')"),
         "encoding_copy_out": ("enc_t", "(90000, 'late')"),
         "binary_format_without_send_function": ("acl_t", "(90000, 'postgres=r/postgres')"),
         "output_function_raises": ("enum_t", "(90000, 'fine')"),
         "raise_in_buffered_run": (TABLE, f"({ROWS + 1000}, 'late')")}


@pytest.mark.parametrize("writer", ["writer past the rows", "no writer"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ERRORS))
def test_error_while_rows_are_handed_on_leaves_the_session_usable(err_tables, plain_reads, case, mode, writer):
    provoke, message = ERRORS[case]
    late = writer_in(err_tables, *READS[case]) if writer == "writer past the rows" else contextlib.nullcontext()
    with late, session(err_tables, mode) as c, connect(err_tables) as watcher:
        pid = c.info.backend_pid
        with pytest.raises(psycopg.Error, match=message):
            provoke(c)

        def no_latch_of_the_session():
            return watcher.execute("SELECT count(*) FROM pgkvx.latches WHERE holder_pid = %s",
                                   (pid,)).fetchone()[0] == 0
        # A read latches nothing, even one that failed.
        wait_until(no_latch_of_the_session, f"the latches of session {pid} to go")
        # The same session goes on: a plain statement, a tail read, a write
        # to the latched table.
        assert c.execute("SELECT 1").fetchone() == (1,)
        assert [i for (i,) in c.execute(tail_sql(AFTER, 5))] == plain_reads[5]
        assert [i for (i,) in c.execute(TAIL_PY, (AFTER, 11), prepare=True)] == plain_reads[11]
        key = 100000 + pid % 100000
        c.execute("INSERT INTO enc_t VALUES (%s, 'x')", (key,))
        c.execute("DELETE FROM enc_t WHERE id = %s", (key,))
        with c.transaction():
            c.execute("INSERT INTO enc_t VALUES (%s, 'y')", (key,))
            assert c.execute("SELECT count(*) FROM pgkvx.latches WHERE holder_pid = pg_backend_pid()").fetchone()[0] > 0
            c.execute("DELETE FROM enc_t WHERE id = %s", (key,))
        # ...and leaves no latch behind.
        wait_until(no_latch_of_the_session, f"the latches of session {pid} to go")
        # Once more, for a session that survived one error but not two.
        with pytest.raises(psycopg.Error, match=message):
            provoke(c)
        assert c.execute("SELECT 1").fetchone() == (1,)
