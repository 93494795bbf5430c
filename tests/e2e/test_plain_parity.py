"""Nothing around pgkvx changes for anyone: errors reach the client exactly
as plain PostgreSQL raises them, and recursion goes as deep.

A plain cluster of the same PostgreSQL tree (no pgkvx preloaded) runs the
same statements as the pgkvx cluster; every field of every error must be
the same -- in a database without the extension, in one with it and every
table latched (errors raised inside LIMIT reads in key order included, in
every scan mode), and on a pgkvx cluster whose server runs with
RUST_BACKTRACE=1 (no Rust backtrace in DETAIL).  Then the deepest recursion
each cluster allows at the same max_stack_depth is measured and compared.
"""
import os
import re
import shutil
import threading

import psycopg
import pytest

from conftest import PG_BINDIR, PORT, as_postgres, connect, conninfo, free_port, side_cluster

DB = "parity"
FIELDS = ["sqlstate", "severity", "severity_nonlocalized", "message_primary", "message_detail", "message_hint",
          "context", "schema_name", "table_name", "column_name", "datatype_name", "constraint_name",
          "statement_position", "internal_position", "internal_query",
          "source_file", "source_line", "source_function"]
MODES = ["off", "optimistic", "fenced"]

SETUP = [
    "CREATE TABLE u1 (id int PRIMARY KEY, v text NOT NULL, n int CONSTRAINT u1_n_positive CHECK (n > 0))",
    "INSERT INTO u1 VALUES (1, 'one', 1)",
    "CREATE TABLE parent (id int PRIMARY KEY)",
    "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent)",
    "INSERT INTO parent VALUES (1)",
    "INSERT INTO child VALUES (1, 1)",
    "CREATE DOMAIN posint AS int CONSTRAINT posint_positive CHECK (VALUE > 0)",
    "CREATE TABLE dom_t (id int PRIMARY KEY, p posint)",
    "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
    "INSERT INTO t SELECT g, g FROM generate_series(1, 20) g",
    """CREATE FUNCTION divz(x int) RETURNS int LANGUAGE plpgsql STABLE AS $$
        BEGIN RETURN 1 / x; END $$""",
    """CREATE FUNCTION raiser() RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'raised with options' USING ERRCODE = 'P0042', DETAIL = 'the detail',
                HINT = 'the hint', COLUMN = 'the_column', CONSTRAINT = 'the_constraint',
                DATATYPE = 'the_type', TABLE = 'the_table', SCHEMA = 'the_schema';
        END $$""",
    """CREATE FUNCTION deep(n int) RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
            IF n = 0 THEN
                RAISE EXCEPTION 'bottom of %', 'deep' USING ERRCODE = 'P0043', DETAIL = 'deep detail',
                    HINT = 'deep hint';
            END IF;
            RETURN deep(n - 1);
        END $$""",
    """CREATE FUNCTION boom(id int) RETURNS int LANGUAGE plpgsql STABLE AS $$
        BEGIN
            IF id = 3 THEN
                RAISE EXCEPTION 'boom on row %', id USING ERRCODE = 'P0044', DETAIL = 'row detail',
                    HINT = 'row hint', TABLE = 't', COLUMN = 'id', SCHEMA = 'public';
            END IF;
            RETURN id;
        END $$""",
    """CREATE FUNCTION tail_in_function() RETURNS int LANGUAGE plpgsql AS $$
        DECLARE r record; s int := 0;
        BEGIN
            FOR r IN SELECT boom(id) AS b FROM t WHERE id > 0 ORDER BY id LIMIT 5 LOOP
                s := s + r.b;
            END LOOP;
            RETURN s;
        END $$""",
    """CREATE FUNCTION trg_reject() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.v < 0 THEN
                RAISE EXCEPTION 'negative v %', NEW.v USING ERRCODE = 'P0045', TABLE = TG_TABLE_NAME;
            END IF;
            RETURN NEW;
        END $$""",
    "CREATE TRIGGER t_reject BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION trg_reject()",
    """CREATE FUNCTION deep_sleep(n int) RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
            IF n = 0 THEN PERFORM pg_sleep(600); RETURN 0; END IF;
            RETURN deep_sleep(n - 1);
        END $$""",
    # For the recursion depth.
    """CREATE FUNCTION rec_plpgsql(n int) RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
            IF n <= 0 THEN RETURN 0; END IF;
            RETURN rec_plpgsql(n - 1) + 1;
        END $$""",
    # Not inlinable (it has a FROM clause): one SQL function call per level.
    """CREATE FUNCTION rec_sql(n int) RETURNS int LANGUAGE sql AS $$
        SELECT CASE WHEN n <= 0 THEN 0 ELSE rec_sql(n - 1) + 1 END FROM (VALUES (1)) AS one(x) $$""",
    # Each level recurses from inside a LIMIT read of t in key order.
    """CREATE FUNCTION rec_read(n int) RETURNS int LANGUAGE plpgsql STABLE AS $$
        DECLARE r int;
        BEGIN
            IF n <= 0 THEN RETURN 0; END IF;
            SELECT rec_read(n - 1) + 1 INTO r FROM t WHERE id > 0 ORDER BY id LIMIT 1;
            RETURN r;
        END $$""",
]
LATCH = [f"SELECT pgkvx.enable('{t}')" for t in ("u1", "parent", "child", "dom_t", "t")]

TAIL_BOOM = "SELECT boom(id) FROM t WHERE id > 0 ORDER BY id LIMIT 5"

# name -> (session settings, statement)
STATEMENTS = {
    "unique_violation": ([], "INSERT INTO u1 VALUES (1, 'again', 1)"),
    "not_null_violation": ([], "INSERT INTO u1 VALUES (2, NULL, 1)"),
    "check_violation": ([], "INSERT INTO u1 VALUES (3, 'three', -1)"),
    "foreign_key_violation": ([], "INSERT INTO child VALUES (2, 999)"),
    "foreign_key_still_referenced": ([], "DELETE FROM parent WHERE id = 1"),
    "domain_check_cast": ([], "SELECT (-1)::posint"),
    "domain_check_insert": ([], "INSERT INTO dom_t VALUES (1, -5)"),
    "division_by_zero_in_plpgsql": ([], "SELECT divz(0)"),
    "raise_with_options": ([], "SELECT raiser()"),
    "raise_50_levels_deep": ([], "SELECT deep(50)"),
    "trigger_raises": ([], "INSERT INTO t VALUES (100, -1)"),
    "unique_violation_on_tail_table": ([], "INSERT INTO t VALUES (1, 1)"),
    "undefined_column": ([], "SELECT nope FROM t"),
    # ~600 levels, with room enough on the stack for both clusters (the
    # depth itself is test_recursion_depth's business): the error must come
    # back as raised, not as a statement timeout (a hang guard only).
    "raise_600_levels_deep": (["SET max_stack_depth = '6MB'"], "SELECT deep(600)"),
    # A statement timeout that fires ~600 levels deep ends the statement
    # (57014, with its CONTEXT) as it does without pgkvx.
    "statement_timeout_600_levels_deep": (["SET max_stack_depth = '6MB'", "SET statement_timeout = '1s'"],
                                          "SELECT deep_sleep(600)"),
}
for m in MODES:
    STATEMENTS[f"tail_raise_{m}"] = ([f"SET pgkvx.scan_mode = {m}"], TAIL_BOOM)
    STATEMENTS[f"tail_division_by_zero_{m}"] = (
        [f"SET pgkvx.scan_mode = {m}"], "SELECT divz(id - 4) FROM t WHERE id > 0 ORDER BY id LIMIT 5")
    STATEMENTS[f"tail_raise_in_plpgsql_loop_{m}"] = ([f"SET pgkvx.scan_mode = {m}"], "SELECT tail_in_function()")
    STATEMENTS[f"tail_raise_prepared_{m}"] = (
        [f"SET pgkvx.scan_mode = {m}", "SET plan_cache_mode = force_generic_plan",
         "PREPARE tail_p(int) AS SELECT boom(id) FROM t WHERE id > $1 ORDER BY id LIMIT 5"],
        "EXECUTE tail_p(0)")
    STATEMENTS[f"tail_raise_at_depth_50_{m}"] = (
        [f"SET pgkvx.scan_mode = {m}"], "SELECT deep(50) FROM t WHERE id > 0 ORDER BY id LIMIT 5")


def setup_db(kw, dbname, extension):
    with connect("postgres", **kw) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{dbname}"')
    with connect(dbname, **kw) as c:
        if extension:
            c.execute("CREATE EXTENSION pgkvx")
        for s in SETUP + (LATCH if extension else []):
            c.execute(s)


def terminate(kw, pid):
    with connect("postgres", **kw) as c:
        c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def error_fields(target, settings, stmt, guard=120):
    """Every field of the error `stmt` raises on `target` (connection
    keywords, database) after `settings`.  A statement timeout and a
    watchdog that ends the session are hang guards, never expectations."""
    kw, dbname = target
    with connect(dbname, **kw) as c:
        c.execute("SET statement_timeout = '90s'")
        for s in settings:
            c.execute(s)
        timer = threading.Timer(guard, terminate, (kw, c.info.backend_pid))
        timer.start()
        try:
            c.execute(stmt)
        except psycopg.Error as e:
            return {f: getattr(e.diag, f) for f in FIELDS}
        finally:
            timer.cancel()
    pytest.fail(f"{stmt} raised no error")


@pytest.fixture(scope="module")
def plain(plain_cluster):
    setup_db(plain_cluster, DB, extension=False)
    return (plain_cluster, DB)


@pytest.fixture(scope="module")
def pgkvx_targets(db):
    """The pgkvx cluster: a database without the extension, and the module's
    database with it and every table latched."""
    noext = db + "_noext"
    setup_db({}, noext, extension=False)
    with connect(db) as c:
        for s in SETUP + LATCH:
            c.execute(s)
    yield {"no_extension": ({}, noext), "latched": ({}, db)}
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{noext}" WITH (FORCE)')


@pytest.fixture(scope="module")
def backtrace_cluster():
    """A pgkvx cluster whose server has RUST_BACKTRACE=1 in its environment
    (scripts/cluster strips it, so this one is started with pg_ctl)."""
    run, where = side_cluster("rbt", free_port(PORT + 6), "pgkvx")
    run("destroy", check=False)
    run("start")
    run("stop")
    try:
        as_postgres("env", "RUST_BACKTRACE=1", f"{PG_BINDIR}/pg_ctl", "-D", where["data"], "-l", where["log"],
                    "-w", "-t", "60", "start")
        kw = {"host": where["host"], "port": where["port"]}
        setup_db(kw, DB, extension=True)
        with connect(DB, **kw) as c:
            assert c.execute("SELECT current_setting('shared_preload_libraries')").fetchone()[0] == "pgkvx"
        yield kw
    finally:
        run("destroy", check=False)
        shutil.rmtree(os.path.dirname(where["data"]), ignore_errors=True)


def assert_no_backtrace(fields):
    detail = fields["message_detail"] or ""
    assert not re.search(r"(?im)backtrace|^\s*\d+: [\w<]", detail), f"a Rust backtrace in DETAIL:\n{detail[:1500]}"


def diff(expected, got):
    """The fields that differ: (expected, got), long values cut short."""
    def short(v):
        return v if not isinstance(v, str) or len(v) <= 240 else f"{v[:120]}...[{len(v)} chars]...{v[-80:]}"
    return {f: (short(expected[f]), short(got[f])) for f in FIELDS if expected[f] != got[f]}


@pytest.mark.parametrize("target", ["no_extension", "latched"])
@pytest.mark.parametrize("name", list(STATEMENTS))
def test_errors_keep_every_field(plain, pgkvx_targets, name, target):
    settings, stmt = STATEMENTS[name]
    expected = error_fields(plain, settings, stmt)
    got = error_fields(pgkvx_targets[target], settings, stmt)
    # The plain cluster did as meant (the statement timeout is a hang guard).
    assert expected["sqlstate"] == "57014" if "timeout" in name else expected["sqlstate"] not in (None, "57014")
    d = diff(expected, got)
    assert not d, f"{name} on {target}, fields that differ (plain, pgkvx): {d}"


@pytest.mark.parametrize("name", [n for n in STATEMENTS if n.startswith("tail_")]
                         + ["raise_with_options", "raise_50_levels_deep", "unique_violation_on_tail_table"])
def test_rust_backtrace_in_the_environment_changes_no_error(plain, backtrace_cluster, name):
    settings, stmt = STATEMENTS[name]
    got = error_fields((backtrace_cluster, DB), settings, stmt)
    assert_no_backtrace(got)
    d = diff(error_fields(plain, settings, stmt), got)
    assert not d, f"{name}, fields that differ (plain, pgkvx with RUST_BACKTRACE=1): {d}"


# pgkvx's own errors: the same with RUST_BACKTRACE=1 as without.
OWN_ERRORS = {
    "enable_a_view": (["CREATE OR REPLACE VIEW tv AS SELECT * FROM t"], "SELECT pgkvx.enable('tv')"),
    "key_bytes_of_a_bad_key": ([], "SELECT pgkvx.key_bytes('t', 'not a number')"),
    "latch_span_of_an_unlatched_table": (["CREATE TABLE IF NOT EXISTS free_t (id int PRIMARY KEY)"],
                                         "SELECT pgkvx.latch_span('free_t', '1', '2')"),
}


@pytest.mark.parametrize("name", list(OWN_ERRORS))
def test_rust_backtrace_in_the_environment_changes_no_pgkvx_error(pgkvx_targets, backtrace_cluster, name):
    settings, stmt = OWN_ERRORS[name]
    expected = error_fields(pgkvx_targets["latched"], settings, stmt)
    got = error_fields((backtrace_cluster, DB), settings, stmt)
    assert_no_backtrace(got)
    d = diff(expected, got)
    assert not d, f"{name}, fields that differ (pgkvx, pgkvx with RUST_BACKTRACE=1): {d}"


# ---- recursion depth -------------------------------------------------------

def reaches(target, settings, fn, depth):
    """Whether `fn(depth)` returns; False when it runs out of stack."""
    kw, dbname = target
    with connect(dbname, **kw) as c:
        c.execute("SET statement_timeout = '60s'")
        c.execute("SET max_stack_depth = '2MB'")
        for s in settings:
            c.execute(s)
        try:
            assert c.execute(f"SELECT {fn}(%s)", (depth,)).fetchone()[0] == depth
            return True
        except psycopg.Error as e:
            # The SQLSTATE is test_errors_keep_every_field's business.
            if "stack depth limit exceeded" in (e.diag.message_primary or ""):
                return False
            raise


def max_depth(target, settings, fn, hi=20000):
    lo = 0
    assert not reaches(target, settings, fn, hi), f"{fn}({hi}) did not run out of stack"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if reaches(target, settings, fn, mid):
            lo = mid
        else:
            hi = mid
    return lo


DEPTHS = {
    "plpgsql": ([], "rec_plpgsql"),
    "sql_function": ([], "rec_sql"),
    "latched_read_optimistic": (["SET pgkvx.scan_mode = optimistic"], "rec_read"),
    "latched_read_fenced": (["SET pgkvx.scan_mode = fenced"], "rec_read"),
}


@pytest.mark.parametrize("case", list(DEPTHS))
def test_recursion_depth(plain, pgkvx_targets, case):
    """At the same max_stack_depth, recursion with pgkvx goes at least 90%
    as deep as without (a ratio of two depths, not a timing)."""
    settings, fn = DEPTHS[case]
    if fn == "rec_read":
        kw, dbname = pgkvx_targets["latched"]
        with connect(dbname, **kw) as c:
            plan = "\n".join(r for (r,) in c.execute(
                "EXPLAIN SELECT rec_read(1) + 1 FROM t WHERE id > 0 ORDER BY id LIMIT 1"))
            assert "PgkvxLimitScan" in plan, plan
    without = max_depth(plain, settings, fn)
    with_pgkvx = max_depth(pgkvx_targets["latched"], settings, fn)
    assert without > 50, f"{fn}: plain PostgreSQL reached only {without} levels"
    assert with_pgkvx >= 0.9 * without, f"{fn}: {with_pgkvx} levels with pgkvx, {without} without"


def page_faults_per_statement(kw, dbname, stmt, runs=200):
    """Minor page faults the backend took per run of `stmt`, after a
    warm-up (from /proc: the backend runs on this machine)."""
    with psycopg.connect(conninfo(dbname, **kw), autocommit=True) as c:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]

        def minflt():
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[7])

        for _ in range(20):
            c.execute(stmt).fetchone()
        before = minflt()
        for _ in range(runs):
            c.execute(stmt).fetchone()
        return (minflt() - before) / runs


def test_heap_top_is_kept_between_statements(plain, pgkvx_targets):
    """src/heap.rs: a statement that ends by freeing about 400 KB in 20 KB
    blocks (a partitioned tail frees 27 KB per partition) has glibc trim
    the heap and fault it back in on every run under its default
    thresholds, as plain PostgreSQL shows here; with pgkvx loaded the
    postmaster primed them, and the heap stays."""
    stmt = "SELECT cardinality(array_agg(repeat('x', 20000))) FROM generate_series(1, 20)"
    plain_kw, plain_db = plain
    ours_kw, ours_db = pgkvx_targets["latched"]
    plain_faults = page_faults_per_statement(plain_kw, plain_db, stmt)
    ours = page_faults_per_statement(ours_kw, ours_db, stmt)
    # The control: without priming this statement refaults ~100 pages.
    assert plain_faults > 50, plain_faults
    assert ours < 5, (ours, plain_faults)
