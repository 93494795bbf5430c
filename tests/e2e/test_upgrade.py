"""Users upgrade in place: ALTER EXTENSION pgkvx UPDATE from 0.1.0 keeps
latched tables working, and installing a new library never crashes a
running server."""
import os
import shutil
import subprocess

import pytest

from conftest import PG_BINDIR, ROOT, connect, scratch_database, stats
from test_tail import run_tail

LIBDIR = subprocess.run([os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config"), "--pkglibdir"],
                        capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def db010():
    with scratch_database("e2e_upgrade_from_010") as name:
        yield name


def surface(c):
    """The extension's objects as a user meets them: functions (signature,
    body, settings, strictness, volatility, privileges), views, columns of
    its tables, event triggers and the extension's members."""
    q = lambda sql: sorted(tuple(r) for r in c.execute(sql).fetchall())  # noqa: E731
    return {
        "functions": q("""SELECT p.proname, pg_get_function_identity_arguments(p.oid),
                                 pg_get_function_result(p.oid), md5(p.prosrc), p.proconfig::text,
                                 p.proisstrict, p.provolatile, p.proacl::text
                            FROM pg_proc p WHERE p.pronamespace = 'pgkvx'::regnamespace"""),
        "views": q("""SELECT viewname, md5(definition) FROM pg_views WHERE schemaname = 'pgkvx'"""),
        "columns": q("""SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
                          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                         WHERE c.relnamespace = 'pgkvx'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped"""),
        "tables": q("""SELECT relname, relkind, relrowsecurity, relacl::text FROM pg_class
                        WHERE relnamespace = 'pgkvx'::regnamespace"""),
        "event_triggers": q("SELECT evtname, evtevent, evtenabled, evttags::text FROM pg_event_trigger"),
        "members": q("""SELECT pg_describe_object(d.classid, d.objid, 0) FROM pg_depend d
                         WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
                           AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pgkvx')"""),
    }


def test_update_from_0_1_0(db010):
    with connect(db010) as c:
        c.execute("CREATE EXTENSION pgkvx VERSION '0.1.0'")
        c.execute("CREATE TABLE events (id bigserial PRIMARY KEY, payload text)")
        c.execute("SELECT pgkvx.enable('events', gapless => true)")
        c.execute("CREATE TABLE coded (id int, code int NOT NULL)")
        c.execute("CREATE UNIQUE INDEX coded_code ON coded (code)")
        c.execute("SELECT pgkvx.enable('coded', 'coded_code')")
        c.execute("INSERT INTO events (payload) SELECT 'before' FROM generate_series(1, 10)")
        c.execute("INSERT INTO coded SELECT g, g FROM generate_series(1, 10) g")
        c.execute("ALTER EXTENSION pgkvx UPDATE")
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pgkvx'").fetchone() == ("0.2.0",)
        assert c.execute("SELECT relid::text, key_columns FROM pgkvx.tables ORDER BY 1").fetchall() == \
            [("coded", [2]), ("events", [1])]
        assert c.execute("SELECT relrowsecurity FROM pg_class WHERE oid = 'pgkvx.tables'::regclass").fetchone() == (False,)
        assert c.execute("SELECT * FROM pgkvx.check()").fetchall() == []
        # 0.2.0's behaviour, on the tables enabled under 0.1.0.
        c.execute("REINDEX INDEX CONCURRENTLY coded_code")
        c.execute("INSERT INTO coded VALUES (11, 11)")
        import psycopg
        with pytest.raises(psycopg.errors.GeneratedAlways):
            c.execute("INSERT INTO events (id, payload) VALUES (1000, 'explicit')")
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            c.execute("SELECT pgkvx.disable(NULL)")
    committed, skipped = run_tail(db010, "events", "optimistic", seed=7)
    assert len(committed) > 50 and skipped == [[]] * len(skipped), skipped
    # What the update made is what a fresh install makes.
    fresh = db010 + "_fresh"
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{fresh}"')
    try:
        with connect(fresh) as c:
            c.execute("CREATE EXTENSION pgkvx")
            want = surface(c)
        with connect(db010) as c:
            assert surface(c) == want
    finally:
        with connect("postgres") as c:
            c.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
    with connect(db010) as c:
        # As in a fresh install, the schema belongs to the extension: DROP
        # EXTENSION leaves nothing, and the extension can be created again.
        member = c.execute("""SELECT count(*) FROM pg_depend d
                               WHERE d.classid = 'pg_namespace'::regclass
                                 AND d.objid = 'pgkvx'::regnamespace
                                 AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'""").fetchone()
        assert member == (1,)
        c.execute("DROP EXTENSION pgkvx CASCADE")
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgkvx'").fetchone() == (0,)
        c.execute("CREATE EXTENSION pgkvx")
        assert c.execute("SELECT pgkvx.version()").fetchone() == ("0.2.0",)


def test_identity_tables_enabled_before_gapless_identity_keys(db010):
    """Tables enabled before identity keys could be gapless: an identity
    table latched under 0.1.0 becomes gapless after the update, and a serial
    gapless table of 0.1.0 gets the new refusals (a sequence moved back)."""
    import psycopg
    with connect(db010) as c:
        c.execute("CREATE EXTENSION pgkvx VERSION '0.1.0'")
        c.execute("CREATE TABLE ident (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload text)")
        c.execute("SELECT pgkvx.enable('ident')")
        c.execute("CREATE TABLE events (id bigserial PRIMARY KEY, payload text)")
        c.execute("SELECT pgkvx.enable('events', gapless => true)")
        c.execute("INSERT INTO ident (payload) SELECT 'before' FROM generate_series(1, 10)")
        c.execute("INSERT INTO events (payload) SELECT 'before' FROM generate_series(1, 10)")
        c.execute("ALTER EXTENSION pgkvx UPDATE")
        c.execute("SELECT pgkvx.enable('ident', gapless => true)")
        assert c.execute("SELECT * FROM pgkvx.check()").fetchall() == []
        plan = "\n".join(r[0] for r in c.execute(
            "EXPLAIN (VERBOSE, COSTS OFF) INSERT INTO ident (payload) VALUES ('x')").fetchall())
        assert "pgkvx.next_key('ident'::regclass)" in plan, plan
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.execute("ALTER SEQUENCE events_id_seq RESTART")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.execute("ALTER TABLE ident ALTER COLUMN id RESTART")
        c.execute("SELECT setval('events_id_seq', 3)")
        assert [r[0] for r in c.execute("SELECT relid::text FROM pgkvx.check()")] == ["events"]
        c.execute("SELECT setval('events_id_seq', 10)")
    committed, skipped = run_tail(db010, "ident", "optimistic", seed=11)
    assert len(committed) > 50 and skipped == [[]] * len(skipped), skipped


def test_installing_a_new_library_keeps_running_backends_alive(conn, tmp_path):
    lib = os.path.join(LIBDIR, "pgkvx.so")
    stage = tmp_path / "stage"
    os.makedirs(stage / LIBDIR.lstrip("/"))
    shutil.copy(lib, stage / LIBDIR.lstrip("/") / "pgkvx.so")
    conn.execute("CREATE TABLE inst (k int PRIMARY KEY)")
    conn.execute("SELECT pgkvx.enable('inst')")
    conn.execute("INSERT INTO inst SELECT generate_series(1, 100)")
    (started,) = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    before = os.stat(lib).st_ino
    done = subprocess.run([os.path.join(ROOT, "scripts", "install"), "--stage", str(stage)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # Renamed into place, not written over the file backends have mapped.
    assert os.stat(lib).st_ino != before
    # This backend, which has the old library loaded, goes on; so does the
    # server.
    assert conn.execute("SELECT k FROM inst WHERE k > 50 ORDER BY k LIMIT 2").fetchall() == [(51,), (52,)]
    conn.execute("INSERT INTO inst VALUES (1000)")
    assert conn.execute("SELECT pg_postmaster_start_time()").fetchone() == (started,)
    conn.execute("DROP TABLE inst")
